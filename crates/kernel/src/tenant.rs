//! Kernels of their own (isolation `user`): which seat a user's run takes, and which kernels
//! have been idle long enough to stop. Pure decisions; the pool's `tenants` applies them under
//! one lock.
//!
//! A seat holds at most one user's kernel. A user with a kernel always goes to it; a user
//! without one takes an empty seat, else the seat of the kernel idle the longest (stopped for
//! them), else nothing: every seat has running turns, and the run is refused (`Busy`), never
//! queued behind another user's work.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// The tenant of a caller without a user (no authentication, or the service token acting for
/// nobody): one tenant of its own. Never a user's key (those start with `u`).
pub const ANONYMOUS: &str = "anonymous";

/// The key of a user's tenancy: what their kernel's directories and their workspaces are named
/// after. Stable, file-system safe whatever the user id holds (slashes, dots, any length):
/// `u` and the first 32 hex digits of SHA-256(user id); [`ANONYMOUS`] for no user.
pub fn user_key(user: Option<&str>) -> String {
    match user {
        None => ANONYMOUS.to_owned(),
        Some(u) => {
            let digest = Sha256::digest(u.as_bytes());
            format!("u{}", hex::encode(&digest[..16]))
        }
    }
}

/// What the decision needs to know of a seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeatView<'a> {
    /// The tenant whose kernel it holds; `None`: empty.
    pub tenant: Option<&'a str>,
    /// Runs bound to its kernel now.
    pub active: usize,
    /// Since its last run ended (or its kernel started).
    pub idle_for: Duration,
}

/// Where a tenant's run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seat {
    /// Its own kernel, in this seat.
    Own(usize),
    /// A kernel is started for it in this seat; `evict`: the idle kernel there is stopped first.
    Take { seat: usize, evict: bool },
    /// Every seat holds another tenant's kernel with running turns.
    Busy,
}

/// The seat `tenant` takes among `seats`.
pub fn seat_for(tenant: &str, seats: &[SeatView<'_>]) -> Seat {
    if let Some(i) = seats.iter().position(|s| s.tenant == Some(tenant)) {
        return Seat::Own(i);
    }
    if let Some(i) = seats.iter().position(|s| s.tenant.is_none()) {
        return Seat::Take {
            seat: i,
            evict: false,
        };
    }
    (0..seats.len())
        .filter(|&i| seats[i].active == 0)
        .max_by_key(|&i| (seats[i].idle_for, std::cmp::Reverse(i)))
        .map_or(Seat::Busy, |seat| Seat::Take { seat, evict: true })
}

/// The seats whose kernels have had no run for `idle_stop` or longer: to be stopped.
pub fn idle(seats: &[SeatView<'_>], idle_stop: Duration) -> Vec<usize> {
    (0..seats.len())
        .filter(|&i| {
            let s = &seats[i];
            s.tenant.is_some() && s.active == 0 && s.idle_for >= idle_stop
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seat(tenant: &str, active: usize, idle_secs: u64) -> SeatView<'_> {
        SeatView {
            tenant: Some(tenant),
            active,
            idle_for: Duration::from_secs(idle_secs),
        }
    }

    const EMPTY: SeatView<'static> = SeatView {
        tenant: None,
        active: 0,
        idle_for: Duration::ZERO,
    };

    #[test]
    fn a_user_key_is_stable_safe_and_never_the_anonymous_one() {
        let a = user_key(Some("alice"));
        assert_eq!(a, user_key(Some("alice")));
        assert_ne!(a, user_key(Some("bob")));
        assert_eq!(a.len(), 33);
        assert!(a.starts_with('u'));
        assert!(a[1..].bytes().all(|b| b.is_ascii_hexdigit()));
        for odd in [
            "../../etc",
            "a/b",
            ".",
            "",
            "anonymous",
            &"x".repeat(10_000),
        ] {
            let k = user_key(Some(odd));
            assert!(
                k.len() == 33 && k.bytes().all(|b| b.is_ascii_alphanumeric()),
                "{k}"
            );
            assert_ne!(k, ANONYMOUS);
        }
        assert_eq!(user_key(None), ANONYMOUS);
    }

    #[test]
    fn a_user_goes_to_their_kernel_however_busy() {
        let seats = [seat("a", 9, 0), EMPTY, seat("b", 0, 99)];
        assert_eq!(seat_for("a", &seats), Seat::Own(0));
        assert_eq!(seat_for("b", &seats), Seat::Own(2));
    }

    #[test]
    fn a_new_user_takes_an_empty_seat_then_the_longest_idle_kernel() {
        let seats = [seat("a", 1, 0), EMPTY, seat("b", 0, 99)];
        assert_eq!(
            seat_for("c", &seats),
            Seat::Take {
                seat: 1,
                evict: false
            }
        );
        let seats = [seat("a", 0, 5), seat("b", 2, 500), seat("c", 0, 50)];
        assert_eq!(
            seat_for("d", &seats),
            Seat::Take {
                seat: 2,
                evict: true
            }
        );
        // Ties go to the first.
        let seats = [seat("a", 1, 0), seat("b", 0, 7), seat("c", 0, 7)];
        assert_eq!(
            seat_for("d", &seats),
            Seat::Take {
                seat: 1,
                evict: true
            }
        );
    }

    #[test]
    fn every_seat_running_turns_is_busy() {
        let seats = [seat("a", 1, 0), seat("b", 3, 900)];
        assert_eq!(seat_for("c", &seats), Seat::Busy);
        assert_eq!(seat_for("c", &[]), Seat::Busy);
    }

    #[test]
    fn only_kernels_without_runs_for_long_enough_are_idle() {
        let stop = Duration::from_secs(60);
        let seats = [
            seat("a", 0, 60),
            seat("b", 1, 600),
            EMPTY,
            seat("c", 0, 59),
            seat("d", 0, 61),
        ];
        assert_eq!(idle(&seats, stop), [0, 4]);
    }
}
