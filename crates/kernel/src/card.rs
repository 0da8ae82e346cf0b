//! The kernel's Agent Card (who the agent is, the extensions it speaks), as last read: kept a
//! minute, waited for at most 2 s; none while no kernel answers.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Pool;

/// How long a kernel's card is kept, and how long it is waited for.
const CARD_FOR: Duration = Duration::from_secs(60);
const CARD_TIMEOUT: Duration = Duration::from_secs(2);

/// The card as last read.
#[derive(Default)]
pub struct CardCache(Mutex<Option<(Instant, Value)>>);

impl CardCache {
    /// The card of a kernel of `pool` (`Null` when none could be read).
    pub async fn card(&self, pool: &Pool) -> Value {
        if let Some((at, card)) = &*self.0.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < CARD_FOR {
                return card.clone();
            }
        }
        let Some(client) = pool.any_client() else {
            return Value::Null;
        };
        match client.agent_card(CARD_TIMEOUT).await {
            Ok(card) if card.is_object() => {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), card.clone()));
                card
            }
            Ok(_) | Err(_) => Value::Null,
        }
    }
}
