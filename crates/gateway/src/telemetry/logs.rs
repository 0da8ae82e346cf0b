//! JSON log lines (`--log-format json`): one object per line with `timestamp` (RFC 3339, UTC,
//! milliseconds), `level`, `target`, `message`, the event's own fields, and the fields of the
//! spans it happened in (innermost first: a run's `thread_id`, `run_id`, `execution_id`, …)
//! at the top level, so that a log query can filter on them directly.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use clock::rfc3339_ms;
use clock::{Clock, SystemClock};

/// Keys the line itself sets; a field of the same name does not replace them.
const RESERVED: [&str; 4] = ["timestamp", "level", "target", "message"];

/// Collects fields into a JSON object.
struct Collect<'a>(&'a mut Map<String, Value>);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_owned(), Value::from(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), Value::from(format!("{value:?}")));
    }
}

/// Span fields kept as a JSON object (the span's extension the event format reads back).
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonFields;

impl<'w> FormatFields<'w> for JsonFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut map = Map::new();
        fields.record(&mut Collect(&mut map));
        write!(writer, "{}", Value::Object(map))
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut map = match serde_json::from_str(&current.fields) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        fields.record(&mut Collect(&mut map));
        current.fields = Value::Object(map).to_string();
        Ok(())
    }
}

/// The line format.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLines;

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Map::new();
        event.record(&mut Collect(&mut fields));
        let mut line = Map::new();
        line.insert(
            "timestamp".into(),
            Value::from(rfc3339_ms(SystemClock.now_ms())),
        );
        line.insert("level".into(), Value::from(meta.level().as_str()));
        line.insert("target".into(), Value::from(meta.target()));
        line.insert(
            "message".into(),
            fields.remove("message").unwrap_or(Value::from("")),
        );
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                let ext = span.extensions();
                let Some(f) = ext.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(span_fields)) = serde_json::from_str(&f.fields) {
                    for (k, v) in span_fields {
                        fields.entry(k).or_insert(v);
                    }
                }
            }
        }
        for (k, v) in fields {
            // `otel.*` fields steer the trace exporter (span kind, name): not log data.
            if !RESERVED.contains(&k.as_str()) && !k.starts_with("otel.") {
                line.insert(k, v);
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::captured::{logged, Captured};

    #[test]
    fn lines_carry_the_ids_of_their_spans_at_the_top_level() {
        let layer = |out: Captured| {
            tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields)
                .event_format(JsonLines)
                .with_writer(move || out.clone())
        };
        let text = logged(layer, || {
            let run = tracing::info_span!(
                "agui.run",
                thread_id = "t-1",
                run_id = tracing::field::Empty
            );
            let _g = run.enter();
            run.record("run_id", "r-1");
            let save = tracing::info_span!("agui.state_save", thread_id = "inner");
            let _s = save.enter();
            tracing::warn!(attempt = 2, level = "not me", "the \"save\" failed");
        });
        let line: Value = serde_json::from_str(text.trim()).expect("one JSON line");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "the \"save\" failed");
        assert_eq!(line["run_id"], "r-1", "recorded after creation");
        assert_eq!(line["thread_id"], "inner", "the innermost span wins");
        assert_eq!(line["attempt"], 2);
        assert!(line["target"].as_str().unwrap().contains("logs"));
        let ts = line["timestamp"].as_str().unwrap();
        assert!(ts.ends_with('Z') && ts.len() == 24, "{ts}");
    }
}
