//! The output without a kernel: a sink whose channel the test reads.

use std::sync::Arc;
use std::time::Duration;

use agui::{Dialect, Event};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::*;
use crate::run::replay::RunEvents;
use crate::telemetry::testing::Counts;
use clock::SystemClock;
use store::{BoxFuture, StoreError};

/// An ending that remembers how the run ended, each time it is asked to write it.
#[derive(Default)]
struct Ends(std::sync::Mutex<Vec<RunOutcome>>);

impl Ending for Ends {
    fn write<'a>(
        &'a self,
        (outcome, _): (RunOutcome, Option<Code>),
        transcript: Option<TranscriptAppend>,
        _: &'a std::collections::BTreeSet<String>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        assert!(transcript.is_none(), "no messages are kept here");
        self.0.lock().unwrap().push(outcome);
        Box::pin(std::future::ready(Ok(())))
    }
}

fn output(dialect: Dialect, replay: Option<Arc<RunEvents>>) -> (Output, mpsc::Receiver<Bytes>) {
    let (sink, rx) = Sink::new(
        64,
        Duration::from_secs(60),
        Arc::new(tokio_util::sync::CancellationToken::new()),
        Arc::new(SystemClock),
        replay,
        Arc::new(Counts::default()),
    );
    let mapper = Mapper::new("run-1", Default::default(), "thread-1");
    (
        Output::new(sink, mapper, dialect, Lang::En, "thread-1", "run-1", None),
        rx,
    )
}

/// The events sent so far, as JSON.
fn received(rx: &mut mpsc::Receiver<Bytes>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Ok(frame) = rx.try_recv() {
        let text = std::str::from_utf8(&frame).unwrap();
        for line in text.lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                out.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    out
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// Opens a text message (a span the terminal event must close).
async fn open_text(out: &mut Output) {
    out.text_delta("m1".into(), "hello").await.unwrap();
}

#[tokio::test]
async fn a_run_ends_once_with_its_spans_closed_first() {
    let (mut out, mut rx) = output(Dialect::Legacy, None);
    let ends = Ends::default();
    out.start(None).await.unwrap();
    open_text(&mut out).await;
    out.finish(None, &ends).await;
    // Every later ending is ignored: exactly one terminal event.
    out.fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE, &ends)
        .await;
    out.finish(None, &ends).await;
    out.abandon(&ends).await;
    assert_eq!(
        *ends.0.lock().unwrap(),
        [RunOutcome::Success],
        "its end written once"
    );
    let events = received(&mut rx);
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(
        out.outcome(),
        (RunOutcome::Success, None),
        "the first ending counts"
    );
    assert!(out.ended());
}

#[tokio::test]
async fn a_failure_is_run_error_after_balanced_spans_in_the_requests_language() {
    let (mut out, mut rx) = output(Dialect::V1, None);
    let ends = Ends::default();
    out.start(None).await.unwrap();
    open_text(&mut out).await;
    out.fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE, &ends)
        .await;
    let events = received(&mut rx);
    assert_eq!(events[0]["protocolVersion"], "1.0");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_ERROR");
    assert_eq!(last["code"], "A2A_UNAVAILABLE");
    assert_eq!(
        last["message"],
        crate::i18n::tr(Lang::En, msg::A2A_UNAVAILABLE)
    );
    assert_eq!(events[events.len() - 2]["type"], "TEXT_MESSAGE_END");
    assert_eq!(
        out.outcome(),
        (RunOutcome::Error, Some(Code::A2aUnavailable))
    );
}

#[tokio::test]
async fn a_cancellation_is_the_cancelled_outcome_for_1_0_only() {
    for (dialect, terminal) in [
        (Dialect::V1, "RUN_FINISHED"),
        (Dialect::Legacy, "RUN_ERROR"),
    ] {
        let (mut out, mut rx) = output(dialect, None);
        let ends = Ends::default();
        out.start(None).await.unwrap();
        out.fail(Code::Cancelled, msg::CANCELLED, &ends).await;
        let events = received(&mut rx);
        let last = events.last().unwrap();
        assert_eq!(last["type"], terminal, "{dialect:?}");
        if dialect == Dialect::V1 {
            assert_eq!(last["outcome"]["type"], "cancelled", "{last}");
        } else {
            assert_eq!(last["code"], "CANCELLED");
        }
        assert_eq!(out.outcome(), (RunOutcome::Cancelled, None));
    }
}

#[tokio::test]
async fn an_interrupt_ends_the_run_with_its_interrupts() {
    let (mut out, mut rx) = output(Dialect::V1, None);
    let ends = Ends::default();
    out.start(None).await.unwrap();
    let interrupt = crate::mapping::interrupt::build(
        "p1",
        serde_json::json!({"kind": "permission", "toolUseId": "t1"})
            .as_object()
            .unwrap(),
        None,
    );
    out.finish(Some(vec![interrupt]), &ends).await;
    let events = received(&mut rx);
    let last = events.last().unwrap();
    assert_eq!(last["outcome"]["type"], "interrupt", "{last}");
    assert_eq!(out.outcome(), (RunOutcome::Interrupt, None));
}

#[tokio::test]
async fn nothing_is_sent_once_the_client_is_gone() {
    let (mut out, rx) = output(Dialect::Legacy, None);
    let ends = Ends::default();
    out.start(None).await.unwrap();
    drop(rx);
    assert!(out
        .emit(Event::StepStarted {
            step_name: "s".into()
        })
        .await
        .is_err());
    assert!(out.is_gone());
    // Carries on quietly: the run may still have to learn its task to cancel it.
    assert!(out
        .emit(Event::StepStarted {
            step_name: "s".into()
        })
        .await
        .is_ok());
    out.fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE, &ends)
        .await;
    assert!(!out.ended(), "nothing reached anyone");
    assert_eq!(out.events_sent(), 2);
}

#[tokio::test]
async fn an_abandoned_run_leaves_a_whole_run_in_its_replay_buffer() {
    let events = RunEvents::new(1 << 20, Duration::from_secs(30));
    let (mut out, rx) = output(Dialect::Legacy, Some(events.clone()));
    let ends = Ends::default();
    out.start(None).await.unwrap();
    open_text(&mut out).await;
    drop(rx);
    out.abandon(&ends).await;
    assert!(out.ended());
    assert_eq!(
        out.outcome().0,
        RunOutcome::Disconnected,
        "no client saw an ending"
    );
    let frames = events.read_after(0).unwrap().frames;
    let types: Vec<String> = frames
        .iter()
        .filter_map(|bytes| {
            let text = std::str::from_utf8(bytes).ok()?;
            let data = text.lines().find_map(|l| l.strip_prefix("data: "))?;
            let v: Value = serde_json::from_str(data).ok()?;
            Some(v["type"].as_str()?.to_owned())
        })
        .collect();
    assert_eq!(
        types,
        [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_ERROR"
        ]
    );
}
