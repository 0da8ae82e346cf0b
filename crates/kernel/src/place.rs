//! Where a thread's run goes among several kernels: a pure decision, which the pool applies to
//! its slots' states under one lock (so that a burst of new threads spreads).
//!
//! A thread stays on its kernel: its session and its task live there, and a kernel asked about a
//! task it does not hold loads it from the shared task directory and rewrites a running one as
//! interrupted. So a thread leaves its kernel only when that kernel is dead (a managed child that
//! exited and is not back yet, an external one that failed its probes several times in a row),
//! and only in a run that restores the session before anything else (a new turn, an answer);
//! guidance and a cancellation are about a task that died with its kernel.
//!
//! With one kernel nothing is decided and nothing is recorded: everything goes to it, as before
//! there were pools, and a thread's file keeps the reference's shape.

/// What placement needs to know of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotView {
    /// It takes calls now.
    pub ready: bool,
    /// What it held in memory is gone (its process exited and is not back, or it failed its
    /// probes): its threads may move.
    pub dead: bool,
    /// Runs bound to it now.
    pub active: usize,
    /// Threads placed on it so far (breaks ties, so that an idle pool fills evenly).
    pub placed: u64,
}

/// What is asked: a run of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask<'a> {
    /// The key of the slot recorded with the thread.
    pub recorded: Option<&'a str>,
    /// The thread was served before any slot was recorded (it has a session or a task): it is on
    /// the first slot.
    pub legacy: bool,
    /// Taken over from another instance (PostgreSQL): its recorded key named that instance's
    /// kernel, and its session is restored first whatever the slot.
    pub took_over: bool,
    /// This run may move the thread (it restores the session before it asks anything else).
    pub may_move: bool,
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Go to `slot` (waiting for it if it is starting). `moved`: restore the session first.
    /// `record`: write the slot's key with the thread before asking the kernel anything.
    Here {
        slot: usize,
        moved: bool,
        record: bool,
    },
    /// No slot can take the thread now: wait for one to be ready, then ask again.
    Wait,
    /// Its kernel is dead and this run may not move the thread.
    Gone,
}

/// Where `ask` goes, among slots named by `keys` in the states `slots` (the same length).
pub fn place(ask: &Ask<'_>, keys: &[&str], slots: &[SlotView]) -> Placement {
    debug_assert_eq!(keys.len(), slots.len());
    if slots.len() <= 1 {
        return Placement::Here {
            slot: 0,
            moved: ask.took_over,
            record: false,
        };
    }
    // Where the thread is now: its recorded slot (an unknown key, one of a kernel no longer
    // configured, is a dead slot), the first for a thread served before slots were recorded.
    let home = match (ask.took_over, ask.recorded) {
        (true, _) => None,
        (false, Some(key)) => Some(keys.iter().position(|k| *k == key)),
        (false, None) if ask.legacy => Some(Some(0)),
        (false, None) => None,
    };
    match home {
        Some(Some(s)) if !slots[s].dead => Placement::Here {
            slot: s,
            moved: false,
            record: ask.recorded.is_none(),
        },
        Some(_) if !ask.may_move => Placement::Gone,
        Some(_) => least_loaded(slots).map_or(Placement::Wait, |slot| Placement::Here {
            slot,
            moved: true,
            record: true,
        }),
        None => least_loaded(slots).map_or(Placement::Wait, |slot| Placement::Here {
            slot,
            moved: ask.took_over,
            record: true,
        }),
    }
}

/// The ready slot with the fewest runs, then the fewest threads placed, then the first.
fn least_loaded(slots: &[SlotView]) -> Option<usize> {
    (0..slots.len())
        .filter(|&i| slots[i].ready)
        .min_by_key(|&i| (slots[i].active, slots[i].placed, i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEYS: [&str; 3] = ["managed:0", "managed:1", "managed:2"];

    fn ready(active: usize, placed: u64) -> SlotView {
        SlotView {
            ready: true,
            dead: false,
            active,
            placed,
        }
    }

    fn dead() -> SlotView {
        SlotView {
            dead: true,
            ..SlotView::default()
        }
    }

    fn starting() -> SlotView {
        SlotView::default()
    }

    fn ask(recorded: Option<&str>) -> Ask<'_> {
        Ask {
            recorded,
            legacy: false,
            took_over: false,
            may_move: true,
        }
    }

    fn here(slot: usize, moved: bool, record: bool) -> Placement {
        Placement::Here {
            slot,
            moved,
            record,
        }
    }

    #[test]
    fn one_kernel_takes_everything_and_nothing_is_recorded() {
        let only = [KEYS[0]];
        for slot in [ready(5, 9), dead(), starting()] {
            assert_eq!(place(&ask(None), &only, &[slot]), here(0, false, false));
            assert_eq!(
                place(&ask(Some("url:ab")), &only, &[slot]),
                here(0, false, false)
            );
            let taken = Ask {
                took_over: true,
                ..ask(None)
            };
            assert_eq!(place(&taken, &only, &[slot]), here(0, true, false));
        }
    }

    #[test]
    fn a_new_thread_goes_to_the_least_loaded_ready_kernel() {
        let slots = [ready(2, 0), ready(1, 5), ready(1, 3)];
        assert_eq!(place(&ask(None), &KEYS, &slots), here(2, false, true));
        // Not to one that is starting, however idle.
        let slots = [ready(4, 4), starting(), dead()];
        assert_eq!(place(&ask(None), &KEYS, &slots), here(0, false, true));
        // Ties go to the first.
        let slots = [ready(0, 0), ready(0, 0), ready(0, 0)];
        assert_eq!(place(&ask(None), &KEYS, &slots), here(0, false, true));
        // None ready: wait.
        let slots = [starting(), dead(), starting()];
        assert_eq!(place(&ask(None), &KEYS, &slots), Placement::Wait);
    }

    #[test]
    fn a_thread_stays_on_its_kernel_while_it_lives() {
        let busy = [ready(0, 0), ready(9, 9), ready(0, 0)];
        let a = ask(Some("managed:1"));
        assert_eq!(place(&a, &KEYS, &busy), here(1, false, false));
        // Starting (not dead): the thread waits for it rather than leave its session.
        let slots = [ready(0, 0), starting(), ready(0, 0)];
        assert_eq!(place(&a, &KEYS, &slots), here(1, false, false));
        // Guidance and cancellations too.
        let stay = Ask {
            may_move: false,
            ..a
        };
        assert_eq!(place(&stay, &KEYS, &busy), here(1, false, false));
    }

    #[test]
    fn a_dead_kernels_thread_moves_only_in_a_run_that_restores_it() {
        let slots = [ready(3, 0), dead(), ready(1, 0)];
        let a = ask(Some("managed:1"));
        assert_eq!(place(&a, &KEYS, &slots), here(2, true, true));
        let stay = Ask {
            may_move: false,
            ..a
        };
        assert_eq!(place(&stay, &KEYS, &slots), Placement::Gone);
        // Nowhere to go yet.
        let slots = [starting(), dead(), starting()];
        assert_eq!(place(&a, &KEYS, &slots), Placement::Wait);
        // A key of a kernel no longer configured is a dead one.
        let gone = ask(Some("url:0123456789abcdef"));
        let slots = [ready(1, 0), ready(0, 0), ready(2, 0)];
        assert_eq!(place(&gone, &KEYS, &slots), here(1, true, true));
    }

    #[test]
    fn a_thread_from_before_slots_is_on_the_first_and_gets_its_key() {
        let legacy = Ask {
            legacy: true,
            ..ask(None)
        };
        let slots = [ready(9, 9), ready(0, 0), ready(0, 0)];
        assert_eq!(place(&legacy, &KEYS, &slots), here(0, false, true));
        let slots = [dead(), ready(0, 0), ready(0, 0)];
        assert_eq!(place(&legacy, &KEYS, &slots), here(1, true, true));
    }

    #[test]
    fn a_thread_taken_over_is_placed_afresh_and_restored() {
        let taken = Ask {
            took_over: true,
            ..ask(Some("managed:0"))
        };
        let slots = [ready(5, 0), ready(0, 0), ready(1, 0)];
        assert_eq!(place(&taken, &KEYS, &slots), here(1, true, true));
    }

    fn slot() -> impl Strategy<Value = SlotView> {
        (any::<bool>(), any::<bool>(), 0usize..4, 0u64..4).prop_map(
            |(ready, dead, active, placed)| SlotView {
                ready: ready && !dead,
                dead,
                active,
                placed,
            },
        )
    }

    proptest! {
        /// Whatever the states: a thread never leaves a live kernel; a move or a new thread
        /// goes to a ready kernel, one with the fewest runs; `Wait` only when none is ready;
        /// a slot not yet recorded is recorded.
        #[test]
        fn placement_rules_hold(
            slots in prop::collection::vec(slot(), 2..5),
            recorded in prop::option::of(0usize..6),
            legacy in any::<bool>(),
            took_over in any::<bool>(),
            may_move in any::<bool>(),
        ) {
            let names: Vec<String> = (0..slots.len()).map(|i| format!("managed:{i}")).collect();
            let keys: Vec<&str> = names.iter().map(String::as_str).collect();
            let key = recorded.map(|i| format!("managed:{i}"));
            let a = Ask { recorded: key.as_deref(), legacy, took_over, may_move };
            let home = match (took_over, recorded) {
                (true, _) => None,
                (false, Some(i)) => Some(i),
                (false, None) => legacy.then_some(0),
            };
            let fewest = slots.iter().filter(|s| s.ready).map(|s| s.active).min();
            match place(&a, &keys, &slots) {
                Placement::Here { slot, moved, record } => {
                    if let Some(h) = home.filter(|&h| h < slots.len() && !slots[h].dead) {
                        prop_assert_eq!((slot, moved), (h, false));
                        prop_assert_eq!(record, recorded.is_none());
                    } else {
                        prop_assert!(slots[slot].ready);
                        prop_assert_eq!(Some(slots[slot].active), fewest);
                        prop_assert!(record);
                        prop_assert_eq!(moved, home.is_some() || took_over);
                    }
                }
                Placement::Wait => {
                    prop_assert!(fewest.is_none());
                    prop_assert!(may_move || home.is_none());
                }
                Placement::Gone => {
                    prop_assert!(!may_move);
                    prop_assert!(home.is_some_and(|h| h >= slots.len() || slots[h].dead));
                }
            }
        }
    }
}
