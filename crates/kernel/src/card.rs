//! The kernel's Agent Card (who the agent is, the extensions it speaks), as last read: kept a
//! minute, and for as long as no kernel answers after it; waited for at most 2 s; none before a
//! kernel first answered.

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
        let last = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((at, card)) = &last {
            if at.elapsed() < CARD_FOR {
                return card.clone();
            }
        }
        // None answers now (users' own kernels are all stopped, or one is restarting), or the
        // one asked fails: the card last read still says who the agent is.
        let Some(client) = pool.any_client() else {
            return last.map_or(Value::Null, |(_, card)| card);
        };
        match client.agent_card(CARD_TIMEOUT).await {
            Ok(card) if card.is_object() => {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), card.clone()));
                card
            }
            Ok(_) | Err(_) => last.map_or(Value::Null, |(_, card)| card),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernel;

    /// A card older than a minute is asked for again; when no kernel answers, the one last read
    /// stands (and nothing before a first answer).
    #[tokio::test]
    async fn the_last_card_stands_while_no_kernel_answers() {
        let down = Pool::one(Kernel::external(
            "http://127.0.0.1:1/",
            None,
            Default::default(),
            None,
        ));
        let cache = CardCache::default();
        assert_eq!(cache.card(&down).await, Value::Null);
        let old = Instant::now() - Duration::from_secs(120);
        *cache.0.lock().unwrap() = Some((old, serde_json::json!({"name": "iac-code"})));
        assert_eq!(cache.card(&down).await["name"], "iac-code");
    }
}
