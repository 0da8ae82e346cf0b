//! A run's output: the events its client sees, in order, ending with exactly one terminal event.
//!
//! [`Output`] owns the run's sink (the channel to the client and the replay buffer) and its
//! mapper (the spans a client has open). Only this type builds a terminal event (`RUN_FINISHED`
//! or `RUN_ERROR`), always after closing every open span, and it sends at most one: once the sink
//! has ended, every later ending is ignored. Phases send their other events through
//! [`Output::emit`] and [`Output::map`].
//!
//! It also records what the run says (`run::record::Recorder`), and before the terminal event is
//! sent (or when the client left for good) has the run's end written, once, through an
//! [`Ending`]: the thread's document as the run leaves it and the run's messages, in one durable
//! write where the store can.

use std::sync::Arc;

use agui::{Dialect, Event, Outcome};

use crate::error::{msg, Code};
use crate::i18n::Lang;
use crate::mapping::Mapper;
use crate::run::record::Recorder;
use crate::run::sink::{GoneSignal, Sink};
use crate::telemetry::Telemetry;
use clock::{rfc3339_ms, Clock};
use store::RunOutcome;
use store::TranscriptAppend;

use super::end::{Ending, Flow};
use crate::run::terminal::Terminal;

/// How a run's messages are kept (its [`Ending`] writes them).
pub(super) struct Keep {
    /// `--transcript-limit`.
    pub limit: usize,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<dyn Telemetry>,
}

/// The events of one run.
pub(super) struct Output {
    recorder: Recorder,
    /// `None`: the run's messages are not kept (the output's own tests).
    keep: Option<Keep>,
    /// The run's end was written (through its [`Ending`]).
    written: bool,
    sink: Sink,
    mapper: Mapper,
    /// How the run ended (the thread's `lastRun`, the metrics, the run's span): outcome and
    /// error code. A run that never ends otherwise ended with its client.
    outcome: (RunOutcome, Option<Code>),
    dialect: Dialect,
    lang: Lang,
    thread_id: String,
    run_id: String,
}

impl Output {
    pub(super) fn new(
        sink: Sink,
        mapper: Mapper,
        dialect: Dialect,
        lang: Lang,
        thread_id: &str,
        run_id: &str,
        keep: Option<Keep>,
    ) -> Output {
        Output {
            recorder: Recorder::new(run_id),
            keep,
            written: false,
            sink,
            mapper,
            outcome: (RunOutcome::Disconnected, None),
            dialect,
            lang,
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
        }
    }

    /// `RUN_STARTED` (the 1.0 wire declares its protocol version).
    pub(super) async fn start(&mut self, parent_run_id: Option<String>) -> Flow {
        let started = Event::RunStarted {
            thread_id: self.thread_id.clone(),
            run_id: self.run_id.clone(),
            parent_run_id,
            protocol_version: (self.dialect == Dialect::V1).then_some(agui::PROTOCOL_VERSION),
        };
        self.emit(started).await
    }

    /// Sends an event that does not end the run; once the client is known to be gone, sends
    /// nothing and carries on (a run may still need to read its stream, to learn the task to
    /// cancel).
    pub(super) async fn emit(&mut self, e: Event) -> Flow {
        debug_assert!(
            !e.is_terminal(),
            "terminal events are the output's own: {e:?}"
        );
        if self.sink.ended() {
            return Ok(());
        }
        // What the run says is its history, whether or not its client is still there.
        self.recorder.event(&e);
        if self.sink.is_gone() {
            return Ok(());
        }
        Ok(self.sink.emit(&e).await?)
    }

    pub(super) async fn emit_all(&mut self, events: Vec<Event>) -> Flow {
        for e in events {
            self.emit(e).await?;
        }
        Ok(())
    }

    /// Maps with the run's mapper and sends what it produced.
    pub(super) async fn map(&mut self, f: impl FnOnce(&mut Mapper, &mut Vec<Event>)) -> Flow {
        let mut events = Vec::new();
        f(&mut self.mapper, &mut events);
        self.emit_all(events).await
    }

    /// A text delta of the kernel's fast path: the message being streamed goes on with one
    /// event encoded straight from the frame; anything else is status text.
    pub(super) async fn text_delta(&mut self, message_id: String, text: &str) -> Flow {
        if let Some(sent) = self.mapper.continue_text(&message_id, text) {
            if !self.sink.ended() {
                self.recorder.text(sent, text);
            }
            if !self.sink.is_gone() {
                self.sink.emit_text_content(sent, text).await?;
            }
            return Ok(());
        }
        self.map(|m, out| m.status_text(Some(message_id), text, false, out))
            .await
    }

    /// What the run records of its request (the user's message, the answers it sends).
    pub(super) fn recorder(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// The run's mapper, for what it knows (digests, pipeline position) and is told.
    pub(super) fn mapper(&mut self) -> &mut Mapper {
        &mut self.mapper
    }

    /// Ends the run with `RUN_FINISHED`: success, or the interrupts it waits for.
    pub(super) async fn finish(
        &mut self,
        interrupts: Option<Vec<agui::Interrupt>>,
        ending: &dyn Ending,
    ) {
        let (outcome, recorded) = match interrupts {
            Some(i) => (Outcome::Interrupt(i), RunOutcome::Interrupt),
            None => (Outcome::Success, RunOutcome::Success),
        };
        let terminal = self.terminal().finished(outcome);
        self.end(terminal, (recorded, None), ending).await;
    }

    /// Ends the run with `RUN_ERROR` (`message`: a catalogue text, translated here, or the
    /// kernel's own words); a cancellation told to a 1.0 client is `RUN_FINISHED` with the
    /// `cancelled` outcome instead.
    pub(super) async fn fail(&mut self, code: Code, message: &str, ending: &dyn Ending) {
        let terminal = self.failure_event(code, message);
        let recorded = match code {
            Code::Cancelled => (RunOutcome::Cancelled, None),
            code => (RunOutcome::Error, Some(code)),
        };
        self.end(terminal, recorded, ending).await;
    }

    /// The client went away for good. With a replay buffer, a late reader still gets a whole
    /// run: spans balanced and one terminal event (cancelled, abandoned). Nothing more is sent.
    pub(super) async fn abandon(&mut self, ending: &dyn Ending) {
        if !self.sink.ended() {
            let mut events = Vec::new();
            self.mapper.close_all(&mut events);
            events.push(self.failure_event(Code::Cancelled, msg::ABANDONED));
            for e in &events {
                self.recorder.event(e);
            }
            self.write_end(ending).await;
            if self.sink.has_replay() {
                for e in events {
                    let _ = self.sink.emit(&e).await;
                }
            }
        }
        self.sink.mark_gone();
    }

    /// Has the run's end written, once: how it ended and what it recorded (none when its
    /// messages are not kept). A transcript that cannot be written does not fail the run: the
    /// client still gets its ending, and the failure is logged and counted.
    async fn write_end(&mut self, ending: &dyn Ending) {
        if std::mem::replace(&mut self.written, true) {
            return;
        }
        let messages = self.recorder.take();
        let add = match &self.keep {
            Some(keep) if !messages.is_empty() => Some(TranscriptAppend {
                run_id: self.run_id.clone(),
                at: rfc3339_ms(keep.clock.now_ms()),
                messages,
                limit: keep.limit,
            }),
            _ => None,
        };
        let kept = add.is_some();
        let ids = self.mapper.message_ids();
        if let (Err(e), true) = (ending.write(self.outcome, add, ids).await, kept) {
            if let Some(keep) = &self.keep {
                keep.metrics.transcript_write_failed();
            }
            tracing::warn!(thread_id = %self.thread_id, run_id = %self.run_id, error = %e,
                "the run's transcript was not written");
        }
    }

    /// Whether the run's end was written (else its release writes it).
    pub(super) fn end_written(&self) -> bool {
        self.written
    }

    /// Spans closed, then the terminal event; only the first ending of a run is sent.
    async fn end(
        &mut self,
        terminal: Event,
        outcome: (RunOutcome, Option<Code>),
        ending: &dyn Ending,
    ) {
        if self.sink.ended() {
            return;
        }
        self.outcome = outcome;
        let mut events = Vec::new();
        self.mapper.close_all(&mut events);
        debug_assert!(!self.mapper.has_open_spans());
        events.push(terminal);
        for e in &events {
            self.recorder.event(e);
        }
        self.write_end(ending).await;
        for e in events {
            if self.sink.is_gone() {
                return;
            }
            if self.sink.emit(&e).await.is_err() {
                return;
            }
        }
    }

    fn failure_event(&self, code: Code, message: &str) -> Event {
        self.terminal()
            .failed(self.dialect, self.lang, code, message)
    }

    fn terminal(&self) -> Terminal<'_> {
        Terminal {
            thread_id: &self.thread_id,
            run_id: &self.run_id,
            usage: self.mapper.usage(),
        }
    }

    /// How the run ended, as recorded.
    pub(super) fn outcome(&self) -> (RunOutcome, Option<Code>) {
        self.outcome
    }

    /// Whether the terminal event was sent.
    pub(super) fn ended(&self) -> bool {
        self.sink.ended()
    }

    pub(super) fn events_sent(&self) -> u64 {
        self.sink.events_sent()
    }

    /// Resolves when the run is without a client for good (see [`Sink::closed`]).
    pub(super) async fn closed(&self) {
        self.sink.closed().await
    }

    pub(super) fn gone_signal(&self) -> GoneSignal {
        self.sink.gone_signal()
    }

    pub(super) fn is_closed(&self) -> bool {
        self.sink.is_closed()
    }

    pub(super) fn is_gone(&self) -> bool {
        self.sink.is_gone()
    }

    pub(super) fn mark_gone(&mut self) {
        self.sink.mark_gone()
    }
}

#[cfg(test)]
mod tests;
