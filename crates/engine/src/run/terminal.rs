//! The one builder of a run's terminal event, for the driver's runs and for the streams that
//! tell a run's end later (a thread's `connect`, an observed execution): `RUN_FINISHED` with its
//! outcome, or `RUN_ERROR` with a translated message, each with the run's token usage.

use agui::{Dialect, Event, Outcome, Usage};

use crate::error::Code;
use crate::i18n::{self, Lang};

/// The run a terminal event ends.
pub struct Terminal<'a> {
    pub thread_id: &'a str,
    pub run_id: &'a str,
    pub usage: Option<Vec<Usage>>,
}

impl Terminal<'_> {
    /// `RUN_FINISHED` with `outcome`.
    pub fn finished(self, outcome: Outcome) -> Event {
        Event::RunFinished {
            thread_id: self.thread_id.to_owned(),
            run_id: self.run_id.to_owned(),
            outcome,
            usage: self.usage,
        }
    }

    /// `RUN_ERROR` with `code` and `message` (a catalogue text, translated into `lang`, or the
    /// kernel's own words).
    pub fn error(self, lang: Lang, code: Code, message: &str) -> Event {
        Event::RunError {
            message: i18n::tr(lang, message),
            code: code.as_str().into(),
            usage: self.usage,
        }
    }

    /// How a run that ended with `code` is told to a client of `dialect`: `RUN_ERROR`, or the
    /// `cancelled` outcome (below).
    pub fn failed(self, dialect: Dialect, lang: Lang, code: Code, message: &str) -> Event {
        if is_cancelled_outcome(dialect, code) {
            self.finished(Outcome::Cancelled)
        } else {
            self.error(lang, code, message)
        }
    }
}

/// Whether a run that ended with `code` is told as AG-UI 1.0's `cancelled` outcome: the run was
/// stopped on request and did not fail. That is every `CANCELLED` ending (the cancellation
/// extension, the kernel reporting the task cancelled, a question the resume cancelled), and only
/// for a client that declared 1.0: 0.0.58 and 0.0.59 reject the outcome, and get
/// `RUN_ERROR CANCELLED` as always. A gateway shutting down, a kernel that went away or an expired
/// interrupt are failures the client did not ask for: they stay `RUN_ERROR`.
fn is_cancelled_outcome(dialect: Dialect, code: Code) -> bool {
    dialect == Dialect::V1 && code == Code::Cancelled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> Terminal<'static> {
        Terminal {
            thread_id: "t",
            run_id: "r",
            usage: None,
        }
    }

    #[test]
    fn only_a_1_0_client_is_told_a_cancellation_as_the_cancelled_outcome() {
        assert!(is_cancelled_outcome(Dialect::V1, Code::Cancelled));
        assert!(!is_cancelled_outcome(Dialect::Legacy, Code::Cancelled));
        for other in [
            Code::A2aUnavailable,
            Code::A2aExecutionFailed,
            Code::ExecutionExpired,
            Code::StatePersistenceFailed,
        ] {
            assert!(!is_cancelled_outcome(Dialect::V1, other), "{other:?}");
        }
    }

    #[test]
    fn a_failure_is_run_error_in_the_clients_language_or_the_cancelled_outcome() {
        let e = run().failed(Dialect::Legacy, Lang::En, Code::Cancelled, "Cancelled");
        assert!(matches!(e, Event::RunError { ref code, .. } if code == "CANCELLED"));
        let e = run().failed(Dialect::V1, Lang::En, Code::Cancelled, "Cancelled");
        assert!(matches!(
            e,
            Event::RunFinished { outcome: Outcome::Cancelled, ref thread_id, .. } if thread_id == "t"
        ));
        let e = run().error(
            Lang::Zh,
            Code::A2aUnavailable,
            crate::error::msg::A2A_UNAVAILABLE,
        );
        match e {
            Event::RunError { message, code, .. } => {
                assert_eq!(code, "A2A_UNAVAILABLE");
                assert_ne!(message, crate::error::msg::A2A_UNAVAILABLE, "translated");
            }
            other => panic!("{other:?}"),
        }
    }
}
