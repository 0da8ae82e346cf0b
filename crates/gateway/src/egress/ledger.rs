//! What each user spent through the egress (pure: the clock is a parameter): totals since this
//! instance started, and the tokens of the last window in [`SLICES`] slices, which the budget is
//! checked against (a slice leaves the window whole, so the window slides by a sixtieth).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::config::egress::Budget;

/// Slices of a window.
const SLICES: u32 = 60;
/// The most users' accounts kept; past it, those with nothing in the window are forgotten.
const MAX_ACCOUNTS: usize = 100_000;

/// A user's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub requests: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Tokens within the window.
    pub window_tokens: u64,
}

#[derive(Default)]
struct Account {
    requests: u64,
    input: u64,
    output: u64,
    /// Tokens reserved by requests whose answers have not ended.
    pending: u64,
    /// (slice number, tokens), oldest first.
    recent: VecDeque<(u64, u64)>,
}

/// Every user's account.
pub struct Ledger {
    origin: Instant,
    window: Duration,
    budget: Option<u64>,
    accounts: HashMap<String, Account>,
}

impl Ledger {
    /// A ledger with `budget` (none: the window is still kept, 24 h, for the totals).
    pub fn new(budget: Option<Budget>, origin: Instant) -> Ledger {
        Ledger {
            origin,
            window: budget.map_or(Duration::from_secs(86_400), |b| b.window),
            budget: budget.map(|b| b.tokens),
            accounts: HashMap::new(),
        }
    }

    fn slice_len(&self) -> Duration {
        self.window / SLICES
    }

    fn slice(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin);
        (since.as_nanos() / self.slice_len().as_nanos().max(1)) as u64
    }

    /// The first slice still in the window at `now`.
    fn oldest(&self, now: Instant) -> u64 {
        (self.slice(now) + 1).saturating_sub(u64::from(SLICES))
    }

    /// Past [`MAX_ACCOUNTS`], before a new user's account: the accounts with nothing reserved
    /// nor in the window are forgotten.
    fn make_room(&mut self, user: &str, now: Instant) {
        if self.accounts.len() < MAX_ACCOUNTS || self.accounts.contains_key(user) {
            return;
        }
        let oldest = self.oldest(now);
        self.accounts
            .retain(|_, a| a.pending > 0 || a.recent.back().is_some_and(|(s, _)| *s >= oldest));
    }

    /// A request of `user`'s may spend up to `tokens`: counted against their budget until its
    /// answer ends ([`Ledger::settle`]).
    pub fn reserve(&mut self, user: &str, tokens: u64, now: Instant) {
        self.make_room(user, now);
        let a = self.accounts.entry(user.to_owned()).or_default();
        a.pending = a.pending.saturating_add(tokens);
    }

    /// A request of `user`'s that reserved `reserved` was answered with `input` and `output`.
    pub fn settle(&mut self, user: &str, reserved: u64, input: u64, output: u64, now: Instant) {
        if let Some(a) = self.accounts.get_mut(user) {
            a.pending = a.pending.saturating_sub(reserved);
        }
        self.spend(user, input, output, now);
    }

    /// A request of `user`'s was answered with `input` and `output` tokens.
    pub fn spend(&mut self, user: &str, input: u64, output: u64, now: Instant) {
        let (slice, oldest) = (self.slice(now), self.oldest(now));
        self.make_room(user, now);
        let a = self.accounts.entry(user.to_owned()).or_default();
        a.requests += 1;
        a.input = a.input.saturating_add(input);
        a.output = a.output.saturating_add(output);
        let tokens = input.saturating_add(output);
        match a.recent.back_mut() {
            Some((s, t)) if *s == slice => *t = t.saturating_add(tokens),
            _ => a.recent.push_back((slice, tokens)),
        }
        while a.recent.front().is_some_and(|(s, _)| *s < oldest) {
            a.recent.pop_front();
        }
    }

    /// `user`'s figures at `now`.
    pub fn totals(&self, user: &str, now: Instant) -> Totals {
        let oldest = self.oldest(now);
        self.accounts
            .get(user)
            .map_or_else(Totals::default, |a| Totals {
                requests: a.requests,
                input_tokens: a.input,
                output_tokens: a.output,
                window_tokens: a
                    .recent
                    .iter()
                    .filter(|(s, _)| *s >= oldest)
                    .fold(0, |sum: u64, (_, t)| sum.saturating_add(*t)),
            })
    }

    /// The budget, if any, and the window.
    pub fn budget(&self) -> (Option<u64>, Duration) {
        (self.budget, self.window)
    }

    /// Whether `user` has spent their budget at `now`: how long until enough of it leaves the
    /// window for them to spend again (at least a second).
    pub fn exhausted(&self, user: &str, now: Instant) -> Option<Duration> {
        let budget = self.budget?;
        let a = self.accounts.get(user)?;
        let oldest = self.oldest(now);
        let mut left = self
            .totals(user, now)
            .window_tokens
            .saturating_add(a.pending);
        if left < budget {
            return None;
        }
        // The slices leave oldest first: when enough have left, the user is under budget (what
        // is reserved leaves when its answers end: a second at least).
        for (s, t) in a.recent.iter().filter(|(s, _)| *s >= oldest) {
            left = left.saturating_sub(*t);
            if left < budget {
                let leaves = self.origin + self.slice_len() * (*s as u32 + SLICES);
                return Some(
                    leaves
                        .saturating_duration_since(now)
                        .max(Duration::from_secs(1)),
                );
            }
        }
        // What is reserved alone reaches the budget: it frees as those answers end.
        Some(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(tokens: u64, minutes: u64) -> (Ledger, Instant) {
        let t0 = Instant::now();
        let b = Budget {
            tokens,
            window: Duration::from_secs(minutes * 60),
        };
        (Ledger::new(Some(b), t0), t0)
    }

    #[test]
    fn totals_and_the_window_slide_per_user() {
        let (mut l, t0) = ledger(1000, 60);
        l.spend("alice", 100, 10, t0);
        l.spend("alice", 200, 20, t0 + Duration::from_secs(30 * 60));
        l.spend("bob", 5, 5, t0);
        assert_eq!(
            l.totals("alice", t0 + Duration::from_secs(31 * 60)),
            Totals {
                requests: 2,
                input_tokens: 300,
                output_tokens: 30,
                window_tokens: 330
            }
        );
        // An hour and a minute later the first request has left the window, not the second.
        let later = t0 + Duration::from_secs(61 * 60);
        assert_eq!(l.totals("alice", later).window_tokens, 220);
        assert_eq!(l.totals("alice", later).input_tokens, 300);
        assert_eq!(l.totals("bob", later).window_tokens, 0);
        assert_eq!(l.totals("carol", later), Totals::default());
    }

    #[test]
    fn a_spent_budget_says_when_it_frees_and_is_per_user() {
        let (mut l, t0) = ledger(1000, 60);
        assert_eq!(l.exhausted("alice", t0), None);
        l.spend("alice", 600, 0, t0);
        assert_eq!(l.exhausted("alice", t0), None);
        let t1 = t0 + Duration::from_secs(10 * 60);
        l.spend("alice", 300, 150, t1);
        let after = l.exhausted("alice", t1).expect("spent");
        // The first 600 leave the window an hour after their slice: 50 minutes from t1.
        assert_eq!(after, Duration::from_secs(50 * 60));
        assert_eq!(l.exhausted("bob", t1), None, "another user's budget");
        assert_eq!(
            l.exhausted("alice", t0 + Duration::from_secs(60 * 60)),
            None
        );
        let (unlimited, _) = (Ledger::new(None, t0), ());
        assert_eq!(unlimited.exhausted("alice", t0), None);
        assert_eq!(unlimited.budget(), (None, Duration::from_secs(86_400)));
    }

    #[test]
    fn what_requests_reserve_counts_until_their_answers_end() {
        let (mut l, t0) = ledger(1000, 60);
        l.reserve("alice", 600, t0);
        assert_eq!(l.exhausted("alice", t0), None);
        l.reserve("alice", 600, t0);
        assert!(l.exhausted("alice", t0).is_some(), "two answers pending");
        l.settle("alice", 600, 50, 10, t0);
        assert_eq!(l.exhausted("alice", t0), None, "one settled for less");
        assert_eq!(l.totals("alice", t0).window_tokens, 60);
        l.settle("alice", 600, 100, 0, t0);
        assert_eq!(l.totals("alice", t0).window_tokens, 160);
        assert_eq!(l.totals("alice", t0).requests, 2);
        // Huge figures saturate, never wrap.
        l.spend("alice", u64::MAX, u64::MAX, t0);
        assert_eq!(l.totals("alice", t0).window_tokens, u64::MAX);
        assert!(l.exhausted("alice", t0).is_some());
    }

    #[test]
    fn one_large_request_past_the_budget_frees_when_it_leaves() {
        let (mut l, t0) = ledger(100, 60);
        l.spend("alice", 5000, 0, t0);
        let wait = l.exhausted("alice", t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(wait, Duration::from_secs(59 * 60));
    }
}
