//! Each account's share of the egress, so that no user's requests crowd out another's: at most
//! a quarter of `--llm-max-requests` at once (at least one), and request bodies held in memory
//! within [`ACCOUNT_BYTES`] an account and [`TOTAL_BYTES`] in all. A place is taken before the
//! body is read and kept until the answer has ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::grants::Account;

/// The most bytes of request bodies one account holds in memory at once.
pub const ACCOUNT_BYTES: usize = 128 * 1024 * 1024;
/// The most bytes of request bodies held in memory at once.
pub const TOTAL_BYTES: usize = 512 * 1024 * 1024;
/// Permits count KiB.
const UNIT: usize = 1024;
/// Accounts kept past this are forgotten when nothing of theirs is held.
const MAX_ACCOUNTS: usize = 10_000;

struct Share {
    requests: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    /// Requests waiting for a place: at most as many as the places, the others refused at once
    /// (a waiting request holds a connection).
    waiting: Arc<std::sync::atomic::AtomicUsize>,
}

/// The shares of every account.
pub struct Shares {
    per_account: usize,
    total: Arc<Semaphore>,
    accounts: Mutex<HashMap<Account, Share>>,
}

/// A place taken: the account's request and the body's bytes, given back when dropped.
#[derive(Debug)]
pub struct Place {
    _request: OwnedSemaphorePermit,
    bytes: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

impl Place {
    /// The body has been sent: its bytes are no longer held.
    pub fn body_sent(&mut self) {
        self.bytes = None;
    }
}

/// Why no place was had in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The account has as many requests as it may.
    Requests,
    /// The bodies held in memory (the account's or all).
    Bytes,
}

impl Shares {
    /// Shares of `max_requests` at once.
    pub fn new(max_requests: usize) -> Shares {
        Shares {
            per_account: (max_requests / 4).max(1),
            total: Arc::new(Semaphore::new(TOTAL_BYTES / UNIT)),
            accounts: Mutex::new(HashMap::new()),
        }
    }

    fn share(&self, account: &Account) -> (Arc<Semaphore>, Arc<Semaphore>, Arc<AtomicUsize>) {
        let mut map = self
            .accounts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= MAX_ACCOUNTS && !map.contains_key(account) {
            let idle = self.per_account;
            map.retain(|_, s| {
                s.requests.available_permits() < idle
                    || s.bytes.available_permits() < ACCOUNT_BYTES / UNIT
            });
        }
        let s = map.entry(account.clone()).or_insert_with(|| Share {
            requests: Arc::new(Semaphore::new(self.per_account)),
            bytes: Arc::new(Semaphore::new(ACCOUNT_BYTES / UNIT)),
            waiting: Arc::default(),
        });
        (s.requests.clone(), s.bytes.clone(), s.waiting.clone())
    }

    /// A place for a request of `account` with a body of up to `bytes`, waited for up to
    /// `within`.
    pub async fn enter(
        &self,
        account: &Account,
        bytes: usize,
        within: Duration,
    ) -> Result<Place, Full> {
        let (requests, own, waiting) = self.share(account);
        let units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        let deadline = tokio::time::Instant::now() + within;
        let request = match requests.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if waiting.fetch_add(1, Ordering::AcqRel) >= self.per_account {
                    waiting.fetch_sub(1, Ordering::AcqRel);
                    return Err(Full::Requests);
                }
                let got = tokio::time::timeout_at(deadline, requests.acquire_owned()).await;
                waiting.fetch_sub(1, Ordering::AcqRel);
                got.ok().and_then(Result::ok).ok_or(Full::Requests)?
            }
        };
        let bytes = tokio::time::timeout_at(deadline, own.acquire_many_owned(units))
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Full::Bytes)?;
        let total = tokio::time::timeout_at(deadline, self.total.clone().acquire_many_owned(units))
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Full::Bytes)?;
        Ok(Place {
            _request: request,
            bytes: Some((bytes, total)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn one_account_takes_a_quarter_of_the_requests_and_others_still_get_theirs() {
        let s = Shares::new(8);
        assert_eq!(s.per_account, 2);
        let alice = Some("alice".to_owned());
        let a1 = s.enter(&alice, 10, NOW).await.unwrap();
        let _a2 = s.enter(&alice, 10, NOW).await.unwrap();
        assert_eq!(s.enter(&alice, 10, NOW).await.unwrap_err(), Full::Requests);
        // As many may wait as there are places; more are refused at once.
        let wait = Duration::from_millis(400);
        let third = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = std::time::Instant::now();
            (s.enter(&alice, 10, wait).await, t.elapsed())
        };
        let (w1, w2, (w3, took)) =
            tokio::join!(s.enter(&alice, 10, wait), s.enter(&alice, 10, wait), third);
        assert!(w1.is_err() && w2.is_err(), "they waited, in vain");
        assert_eq!(w3.unwrap_err(), Full::Requests);
        assert!(
            took < Duration::from_millis(100),
            "refused at once: {took:?}"
        );
        assert!(s.enter(&Some("bob".into()), 10, NOW).await.is_ok());
        assert!(s.enter(&None, 10, NOW).await.is_ok(), "the shared kernels'");
        drop(a1);
        assert!(s.enter(&alice, 10, NOW).await.is_ok(), "given back");
        assert_eq!(Shares::new(1).per_account, 1);
    }

    #[tokio::test]
    async fn bodies_held_are_bounded_per_account_and_in_all() {
        let s = Shares::new(4096);
        let big = 32 * 1024 * 1024;
        let alice = Some("alice".to_owned());
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(s.enter(&alice, big, NOW).await.unwrap());
        }
        assert_eq!(s.enter(&alice, big, NOW).await.unwrap_err(), Full::Bytes);
        for user in ["bob", "carol", "dave"] {
            for _ in 0..4 {
                held.push(s.enter(&Some(user.into()), big, NOW).await.unwrap());
            }
        }
        assert_eq!(
            s.enter(&Some("erin".into()), big, NOW).await.unwrap_err(),
            Full::Bytes,
            "512 MiB in all"
        );
        held.pop();
        assert!(s.enter(&Some("erin".into()), big, NOW).await.is_ok());
        // A body sent gives its bytes back, not its request's place.
        let mut sent = held.pop().unwrap();
        sent.body_sent();
        assert!(s.enter(&Some("erin".into()), big, NOW).await.is_ok());
    }
}
