//! The gateway's Prometheus metrics, kept with `prometheus-client` and exposed in its text format
//! on the admin listener (`admin`).
//!
//! Every family is registered once, at start. Handles the hot path uses (events by type, the
//! outcomes of runs) are looked up then and kept, so that counting an event is one atomic add:
//! no lock, no allocation, no label lookup. Labels have few values: never a thread, run,
//! execution or user id.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::error::Code;

pub use engine::telemetry::{InterruptEvent, Limit, Telemetry};
pub use store::RunOutcome;

/// Why trace spans were lost (`agui_trace_spans_dropped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum DropReason {
    /// The export queue was full (the exporter is down or slow).
    QueueFull = 0,
    /// Their batch could not be exported.
    ExportFailed = 1,
}

/// One counter of `family` per value of `E`, in the order of its values (its index is the
/// value's discriminant).
fn per_value<E, L, const N: usize>(
    family: &Family<L, Counter>,
    label: impl Fn(&'static str) -> L,
) -> [Counter; N]
where
    E: strum::VariantArray + Copy + Into<&'static str>,
    L: Clone + std::hash::Hash + Eq,
{
    assert_eq!(E::VARIANTS.len(), N, "a counter for each value");
    std::array::from_fn(|i| family.get_or_create_owned(&label(E::VARIANTS[i].into())))
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FinishedLabels {
    outcome: &'static str,
    code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabel {
    r#type: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabel {
    event: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TokenKindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LimitLabel {
    limit: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MethodLabel {
    method: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HttpLabels {
    route: &'static str,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// Seconds: 1 ms to about 1 h, for runs (a parked run may last hours: the last bucket catches it).
fn run_buckets() -> impl Iterator<Item = f64> {
    [
        0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        600.0, 1800.0, 3600.0,
    ]
    .into_iter()
}

/// Seconds: 50 µs to 10 s, for admissions, saves and kernel calls.
fn short_buckets() -> impl Iterator<Item = f64> {
    [
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
        1.0, 2.5, 5.0, 10.0,
    ]
    .into_iter()
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn short_histogram() -> Histogram {
    Histogram::new(short_buckets())
}

/// What the kernel reports at each scrape (read from its supervisor, not counted here).
pub trait KernelGauges: Send + Sync + std::fmt::Debug + 'static {
    /// Whether the kernel answers.
    fn up(&self) -> bool;
    /// How often the managed kernel was restarted.
    fn restarts(&self) -> u64;
    /// Each kernel of a pool of several, in slot order; none with one kernel (its figures are
    /// the two above).
    fn slots(&self) -> Vec<SlotGauges> {
        Vec::new()
    }
    /// Users' own kernels (isolation `user`): how many are alive, started, stopped and
    /// restored; none in `shared` mode.
    fn tenants(&self) -> Option<TenantCounts> {
        None
    }
}

pub use kernel::{SlotGauges, TenantCounts};

impl KernelGauges for kernel::Pool {
    fn up(&self) -> bool {
        kernel::Pool::up(self)
    }
    fn restarts(&self) -> u64 {
        kernel::Pool::restarts(self)
    }
    fn slots(&self) -> Vec<SlotGauges> {
        self.slot_gauges()
    }
    fn tenants(&self) -> Option<TenantCounts> {
        kernel::Pool::tenants(self).map(|t| t.counts())
    }
}

/// Encodes one family of the pool's kernels, labelled by slot only.
fn encode_slots<M: EncodeMetric>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    slots: &[SlotGauges],
    metric: impl Fn(&SlotGauges) -> M,
) -> Result<(), std::fmt::Error> {
    let Some(first) = slots.first() else {
        return Ok(());
    };
    let mut family = encoder.encode_descriptor(name, help, None, metric(first).metric_type())?;
    for (i, s) in slots.iter().enumerate() {
        let labels = [("slot", i.to_string())];
        metric(s).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The kernel's figures, encoded at scrape time (once the kernel is known).
#[derive(Debug, Default)]
struct KernelCollector(Arc<OnceLock<Arc<dyn KernelGauges>>>);

impl prometheus_client::collector::Collector for KernelCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(kernel) = self.0.get() else {
            return Ok(());
        };
        let up = ConstGauge::new(i64::from(kernel.up()));
        up.encode(encoder.encode_descriptor(
            "agui_kernel_up",
            "Whether the execution kernel answers (1) or not (0)",
            None,
            up.metric_type(),
        )?)?;
        let restarts = ConstCounter::new(kernel.restarts());
        restarts.encode(encoder.encode_descriptor(
            "agui_kernel_restarts",
            "Restarts of the managed execution kernel",
            None,
            restarts.metric_type(),
        )?)?;
        let slots = kernel.slots();
        encode_slots(
            &mut encoder,
            (
                "agui_kernel_slot_up",
                "Whether each kernel of the pool answers (1) or not (0)",
            ),
            &slots,
            |s| ConstGauge::new(i64::from(s.up)),
        )?;
        encode_slots(
            &mut encoder,
            (
                "agui_kernel_slot_restarts",
                "Restarts of each managed kernel of the pool",
            ),
            &slots,
            |s| ConstCounter::new(s.restarts),
        )?;
        encode_slots(
            &mut encoder,
            (
                "agui_kernel_slot_active_runs",
                "Runs bound to each kernel of the pool",
            ),
            &slots,
            |s| ConstGauge::new(s.active as i64),
        )?;
        if let Some(t) = kernel.tenants() {
            let alive = ConstGauge::new(t.alive as i64);
            alive.encode(encoder.encode_descriptor(
                "agui_kernels_alive",
                "Users' own kernels alive (isolation user)",
                None,
                alive.metric_type(),
            )?)?;
            for (name, help, n) in [
                ("agui_kernels_started", "Users' own kernels started", t.started),
                ("agui_kernels_stopped", "Users' own kernels stopped (idle, or a seat needed)", t.stopped),
                ("agui_kernels_restored", "Users' own kernels started again for a user who had one, restoring their sessions", t.restored),
            ] {
                let c = ConstCounter::new(n);
                c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
            }
            if let Some(f) = t.fork {
                let up = ConstGauge::new(i64::from(f.up));
                up.encode(encoder.encode_descriptor(
                    "agui_kernel_fork_server_up",
                    "Whether the kernel fork server is ready (users' kernels are spawned while it is not)",
                    None,
                    up.metric_type(),
                )?)?;
                for (name, help, n) in [
                    (
                        "agui_kernels_forked",
                        "Users' own kernels forked by the kernel fork server",
                        f.forked,
                    ),
                    (
                        "agui_kernel_fork_server_restarts",
                        "Restarts of the kernel fork server",
                        f.restarts,
                    ),
                ] {
                    let c = ConstCounter::new(n);
                    c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
                }
            }
        }
        Ok(())
    }
}

/// Every metric of the gateway.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    runs_started: Counter,
    runs_finished: Family<FinishedLabels, Counter>,
    run_duration: Histogram,
    active_runs: Gauge,
    pending_interrupts: Gauge,
    interrupts: [Counter; 4],
    events_sent: [Counter; agui::EVENT_TYPES.len()],
    client_disconnects: Counter,
    images_decoded: Counter,
    admission_duration: Histogram,
    state_save_duration: Histogram,
    state_save_failures: Counter,
    transcript_write_failures: Counter,
    kernel_request_duration: HistogramFamily<MethodLabel>,
    http_requests: Family<HttpLabels, Counter>,
    spans_dropped: [Counter; 2],
    limits_reached: [Counter; 6],
    auth_refusals: Family<ReasonLabel, Counter>,
    llm_requests: Family<OutcomeLabel, Counter>,
    llm_duration: Histogram,
    llm_head: Histogram,
    llm_tokens: [Counter; 2],
    kernel: Arc<OnceLock<Arc<dyn KernelGauges>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        let runs_started = Counter::default();
        r.register(
            "agui_runs_started",
            "Runs admitted (each ends once in agui_runs_finished_total)",
            runs_started.clone(),
        );
        let runs_finished = Family::<FinishedLabels, Counter>::default();
        r.register(
            "agui_runs_finished",
            "Runs ended, by outcome (success, interrupt, error, cancelled, disconnected) and error code",
            runs_finished.clone(),
        );
        let run_duration = Histogram::new(run_buckets());
        r.register(
            "agui_run_duration_seconds",
            "From admission to the end of a run",
            run_duration.clone(),
        );
        let active_runs = Gauge::default();
        r.register(
            "agui_active_runs",
            "Runs admitted and not ended",
            active_runs.clone(),
        );
        let pending_interrupts = Gauge::default();
        r.register(
            "agui_pending_interrupts",
            "Interrupts waiting for an answer, in the thread state this instance knows",
            pending_interrupts.clone(),
        );
        let interrupt_family = Family::<EventLabel, Counter>::default();
        r.register(
            "agui_interrupts",
            "Interrupts by what happened to them (created, resolved, expired, cancelled)",
            interrupt_family.clone(),
        );
        let interrupts =
            per_value::<InterruptEvent, _, 4>(&interrupt_family, |event| EventLabel { event });
        let events_family = Family::<TypeLabel, Counter>::default();
        r.register(
            "agui_events_sent",
            "AG-UI events sent, by type",
            events_family.clone(),
        );
        let events_sent =
            agui::EVENT_TYPES.map(|t| events_family.get_or_create_owned(&TypeLabel { r#type: t }));
        let client_disconnects = Counter::default();
        r.register(
            "agui_client_disconnects",
            "Runs whose client went away before the run ended",
            client_disconnects.clone(),
        );
        let images_decoded = Counter::default();
        r.register(
            "agui_images_decoded",
            "Images of requests handed to the decoder (valid or not), once every other check passed and their thread would admit the request",
            images_decoded.clone(),
        );
        let admission_duration = short_histogram();
        r.register(
            "agui_admission_duration_seconds",
            "Admission of a run: thread lock, load, decision and the durable save before the stream starts",
            admission_duration.clone(),
        );
        let state_save_duration = short_histogram();
        r.register(
            "agui_state_save_duration_seconds",
            "Durable saves of thread state",
            state_save_duration.clone(),
        );
        let state_save_failures = Counter::default();
        r.register(
            "agui_state_save_failures",
            "Saves of thread state that failed",
            state_save_failures.clone(),
        );
        let transcript_write_failures = Counter::default();
        r.register(
            "agui_transcript_write_failures",
            "Runs whose messages could not be added to their thread's transcript",
            transcript_write_failures.clone(),
        );
        let kernel_request_duration =
            HistogramFamily::<MethodLabel>::new_with_constructor(short_histogram);
        r.register(
            "agui_kernel_request_duration_seconds",
            "Kernel calls by method (a stream until its response head)",
            kernel_request_duration.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        r.register(
            "agui_http_requests",
            "HTTP requests by route and status",
            http_requests.clone(),
        );
        let dropped_family = Family::<ReasonLabel, Counter>::default();
        r.register(
            "agui_trace_spans_dropped",
            "Trace spans lost: the export queue was full, or their export failed",
            dropped_family.clone(),
        );
        let spans_dropped =
            per_value::<DropReason, _, 2>(&dropped_family, |reason| ReasonLabel { reason });
        let limit_family = Family::<LimitLabel, Counter>::default();
        r.register(
            "agui_limit_reached",
            "Bounds on concurrent work reached: connections (accept waited), runs, detached_runs \
             (a run cancelled instead of detached), readers, guidance (refused)",
            limit_family.clone(),
        );
        let limits_reached = per_value::<Limit, _, 6>(&limit_family, |limit| LimitLabel { limit });
        let auth_refusals = Family::<ReasonLabel, Counter>::default();
        r.register(
            "agui_auth_refusals",
            "Requests refused access: by authentication (missing, wrong_token, malformed, \
             algorithm, unknown_key, signature, expired, not_yet_valid, issuer, audience, user, \
             user_header, bad_user_header) or by ownership (not_owner, user_mismatch)",
            auth_refusals.clone(),
        );
        let llm_requests = Family::<OutcomeLabel, Counter>::default();
        r.register(
            "agui_llm_requests",
            "Kernels' LLM requests through the egress, by outcome: ok (2xx), upstream_4xx, \
             upstream_5xx, failed (no answer, or one broken off), left (the kernel left before \
             the end), denied (no valid capability), budget (a user's token budget spent), busy \
             (--llm-max-requests or the user's share waited too long), invalid (an unknown \
             route, a request too large or too slow)",
            llm_requests.clone(),
        );
        let llm_duration = Histogram::new(run_buckets());
        r.register(
            "agui_llm_request_duration_seconds",
            "From an LLM request's arrival at the egress to the end of its answer",
            llm_duration.clone(),
        );
        let llm_head = Histogram::new(run_buckets());
        r.register(
            "agui_llm_response_head_seconds",
            "From an LLM request's arrival at the egress to the upstream's answer head",
            llm_head.clone(),
        );
        let llm_token_family = Family::<TokenKindLabel, Counter>::default();
        r.register(
            "agui_llm_tokens",
            "Tokens the upstream reported in its answers (input, output), else estimated",
            llm_token_family.clone(),
        );
        let llm_tokens = ["input", "output"].map(|kind| {
            llm_token_family
                .get_or_create(&TokenKindLabel { kind })
                .clone()
        });
        let kernel = Arc::new(OnceLock::new());
        r.register_collector(Box::new(KernelCollector(kernel.clone())));
        // A gauge of 1 (the Prometheus convention for build info; promtool knows no `info` type).
        let build = Family::<VersionLabel, Gauge>::default();
        build
            .get_or_create(&VersionLabel {
                version: env!("CARGO_PKG_VERSION"),
            })
            .set(1);
        r.register("agui_build_info", "The gateway's version", build);
        Metrics {
            registry: r,
            runs_started,
            runs_finished,
            run_duration,
            active_runs,
            pending_interrupts,
            interrupts,
            events_sent,
            client_disconnects,
            images_decoded,
            admission_duration,
            state_save_duration,
            state_save_failures,
            transcript_write_failures,
            kernel_request_duration,
            http_requests,
            spans_dropped,
            limits_reached,
            auth_refusals,
            llm_requests,
            llm_duration,
            llm_head,
            llm_tokens,
            kernel,
        }
    }

    /// An LLM request through the egress ended with `outcome` after `took`.
    pub fn llm_request(&self, outcome: &'static str, took: Duration) {
        self.llm_requests
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.llm_duration.observe(took.as_secs_f64());
    }

    /// The upstream's answer head came `took` after the request.
    pub fn llm_head(&self, took: Duration) {
        self.llm_head.observe(took.as_secs_f64());
    }

    /// Tokens an upstream answer reported.
    pub fn llm_tokens(&self, input: u64, output: u64) {
        self.llm_tokens[0].inc_by(input);
        self.llm_tokens[1].inc_by(output);
    }

    /// Reports `kernel`'s state at each scrape (the first kernel given; there is one).
    pub fn watch_kernel(&self, kernel: Arc<dyn KernelGauges>) {
        let _ = self.kernel.set(kernel);
    }

    /// The text exposition (OpenMetrics, ending with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The classic Prometheus text exposition (version 0.0.4).
    pub fn encode_prometheus_text(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn state_save(&self, took: Duration, ok: bool) {
        self.state_save_duration.observe(took.as_secs_f64());
        if !ok {
            self.state_save_failures.inc();
        }
    }

    pub fn kernel_request(&self, method: &'static str, took: Duration) {
        self.kernel_request_duration
            .get_or_create(&MethodLabel { method })
            .observe(took.as_secs_f64());
    }

    pub fn http_request(&self, route: &'static str, status: u16) {
        self.http_requests
            .get_or_create(&HttpLabels { route, status })
            .inc();
    }

    pub fn spans_dropped(&self, reason: DropReason, n: u64) {
        self.spans_dropped[reason as usize].inc_by(n);
    }
}

impl Telemetry for Metrics {
    fn run_started(&self) {
        self.runs_started.inc();
        self.active_runs.inc();
    }

    fn run_finished(&self, outcome: RunOutcome, code: Option<Code>, took: Duration) {
        self.active_runs.dec();
        self.run_duration.observe(took.as_secs_f64());
        let labels = FinishedLabels {
            outcome: outcome.as_str(),
            code: code.map_or("", Code::as_str),
        };
        self.runs_finished.get_or_create(&labels).inc();
        if outcome == RunOutcome::Disconnected {
            self.client_disconnects.inc();
        }
    }

    /// One event of type `index` ([`agui::Event::type_index`]) sent: one atomic add.
    #[inline]
    fn event_sent(&self, index: usize) {
        if let Some(c) = self.events_sent.get(index) {
            c.inc();
        }
    }

    fn interrupts(&self, event: InterruptEvent, n: usize) {
        if n > 0 {
            self.interrupts[event as usize].inc_by(n as u64);
        }
    }

    /// The number of pending interrupts changed by `delta`.
    fn pending_changed(&self, delta: i64) {
        if delta != 0 {
            self.pending_interrupts.inc_by(delta);
        }
    }

    /// `n` images are about to be decoded.
    fn images_decoded(&self, n: usize) {
        self.images_decoded.inc_by(n as u64);
    }

    fn admission(&self, took: Duration) {
        self.admission_duration.observe(took.as_secs_f64());
    }

    fn transcript_write_failed(&self) {
        self.transcript_write_failures.inc();
    }

    fn limit_reached(&self, limit: Limit) {
        self.limits_reached[limit as usize].inc();
    }

    /// A request refused access, for `reason` (a fixed set: see `auth::access`).
    fn auth_refused(&self, reason: &'static str) {
        self.auth_refusals
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels the families are made with: each value's name in snake case, in its order.
    #[test]
    fn each_labelled_value_has_its_name() {
        let m = Metrics::new();
        m.interrupts(InterruptEvent::Expired, 1);
        m.spans_dropped(DropReason::ExportFailed, 2);
        m.limit_reached(Limit::DetachedRuns);
        let text = m.encode_prometheus_text();
        for line in [
            "agui_interrupts_total{event=\"expired\"} 1",
            "agui_interrupts_total{event=\"created\"} 0",
            "agui_trace_spans_dropped_total{reason=\"export_failed\"} 2",
            "agui_trace_spans_dropped_total{reason=\"queue_full\"} 0",
            "agui_limit_reached_total{limit=\"detached_runs\"} 1",
            "agui_limit_reached_total{limit=\"guidance\"} 0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(RunOutcome::Disconnected.as_str(), "disconnected");
    }

    #[derive(Debug)]
    struct Down;
    impl KernelGauges for Down {
        fn up(&self) -> bool {
            false
        }
        fn restarts(&self) -> u64 {
            3
        }
    }

    /// A pool of two kernels: the totals, and each kernel labelled by its slot.
    #[derive(Debug)]
    struct Two;
    impl KernelGauges for Two {
        fn up(&self) -> bool {
            true
        }
        fn restarts(&self) -> u64 {
            5
        }
        fn tenants(&self) -> Option<TenantCounts> {
            Some(TenantCounts {
                alive: 2,
                started: 7,
                stopped: 5,
                restored: 3,
                fork: Some(kernel::ForkCounts {
                    forked: 6,
                    restarts: 1,
                    up: true,
                }),
            })
        }
        fn slots(&self) -> Vec<SlotGauges> {
            vec![
                SlotGauges {
                    up: true,
                    restarts: 1,
                    active: 3,
                },
                SlotGauges {
                    up: false,
                    restarts: 4,
                    active: 0,
                },
            ]
        }
    }

    #[test]
    fn a_pools_kernels_are_each_labelled_by_slot_and_one_kernel_adds_none() {
        let m = Metrics::new();
        m.watch_kernel(Arc::new(Two));
        let text = m.encode();
        for l in [
            "agui_kernel_up 1",
            "agui_kernel_restarts_total 5",
            "agui_kernels_alive 2",
            "agui_kernels_started_total 7",
            "agui_kernels_stopped_total 5",
            "agui_kernels_restored_total 3",
            "agui_kernel_fork_server_up 1",
            "agui_kernels_forked_total 6",
            "agui_kernel_fork_server_restarts_total 1",
            "# TYPE agui_kernel_slot_up gauge",
            "agui_kernel_slot_up{slot=\"0\"} 1",
            "agui_kernel_slot_up{slot=\"1\"} 0",
            "# TYPE agui_kernel_slot_restarts counter",
            "agui_kernel_slot_restarts_total{slot=\"0\"} 1",
            "agui_kernel_slot_restarts_total{slot=\"1\"} 4",
            "agui_kernel_slot_active_runs{slot=\"0\"} 3",
            "agui_kernel_slot_active_runs{slot=\"1\"} 0",
        ] {
            assert!(text.lines().any(|x| x == l), "{l} missing in\n{text}");
        }
        let one = Metrics::new();
        one.watch_kernel(Arc::new(Down));
        let text = one.encode();
        assert!(!text.contains("agui_kernel_slot") && !text.contains("agui_kernels_"));
    }

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn every_family_is_exposed_with_its_values() {
        let m = Metrics::new();
        m.watch_kernel(Arc::new(Down));
        m.run_started();
        m.run_started();
        m.run_finished(
            RunOutcome::Error,
            Some(Code::A2aUnavailable),
            Duration::from_millis(20),
        );
        m.event_sent(agui::TEXT_MESSAGE_CONTENT_INDEX);
        m.event_sent(agui::TEXT_MESSAGE_CONTENT_INDEX);
        m.event_sent(usize::MAX);
        m.interrupts(InterruptEvent::Created, 2);
        m.pending_changed(2);
        m.pending_changed(-1);
        m.state_save(Duration::from_millis(1), false);
        m.transcript_write_failed();
        m.kernel_request("CancelTask", Duration::from_millis(3));
        m.http_request("/", 200);
        let text = m.encode();
        for (prefix, value) in [
            ("agui_runs_started_total ", "2"),
            (
                "agui_runs_finished_total{outcome=\"error\",code=\"A2A_UNAVAILABLE\"} ",
                "1",
            ),
            ("agui_active_runs ", "1"),
            ("agui_pending_interrupts ", "1"),
            ("agui_interrupts_total{event=\"created\"} ", "2"),
            ("agui_interrupts_total{event=\"expired\"} ", "0"),
            (
                "agui_events_sent_total{type=\"TEXT_MESSAGE_CONTENT\"} ",
                "2",
            ),
            ("agui_events_sent_total{type=\"RUN_STARTED\"} ", "0"),
            ("agui_state_save_failures_total ", "1"),
            ("agui_transcript_write_failures_total ", "1"),
            ("agui_state_save_duration_seconds_count ", "1"),
            (
                "agui_kernel_request_duration_seconds_count{method=\"CancelTask\"} ",
                "1",
            ),
            ("agui_http_requests_total{route=\"/\",status=\"200\"} ", "1"),
            ("agui_kernel_up ", "0"),
            ("agui_kernel_restarts_total ", "3"),
            ("agui_run_duration_seconds_count ", "1"),
            ("agui_client_disconnects_total ", "0"),
        ] {
            let l = line(&text, prefix).unwrap_or_else(|| panic!("{prefix} missing in\n{text}"));
            assert_eq!(&l[prefix.len()..], value, "{l}");
        }
        assert!(
            text.contains(&format!(
                "agui_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn a_disconnected_run_counts_as_a_client_disconnect() {
        let m = Metrics::new();
        m.run_started();
        m.run_finished(RunOutcome::Disconnected, None, Duration::ZERO);
        let text = m.encode();
        assert!(text.contains("agui_client_disconnects_total 1"), "{text}");
        assert!(text.contains("agui_runs_finished_total{outcome=\"disconnected\",code=\"\"} 1"));
        assert!(text.contains("agui_active_runs 0"));
    }
}
