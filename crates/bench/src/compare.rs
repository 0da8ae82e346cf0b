//! `--compare "ARGS"`: what a configuration (or another build, `--compare-gateway PATH`) costs,
//! measured side by side in one run. Each round starts both gateways one after the other (the
//! order alternating between rounds, so that a drift of the shared machine falls on both), warms
//! each up, then measures the throughput run and the fan-in runs and the gateway's CPU per event,
//! then the rate of whole short turns (admission to end, transcript written) and their CPU (each
//! thread's first turn, which makes it, apart from its later ones), then
//! the admission of streams that stay open (the rate and the CPU of each).
//! The medians over the rounds are printed, with the variant's share of the base.

use super::*;

/// One gateway's figures of one round.
#[derive(Clone, Copy, Default)]
struct Round {
    throughput_eps: f64,
    fan_in_s: f64,
    event_cpu_us: f64,
    /// The first turn of each thread (the thread is made), then its later turns.
    first_turns_per_s: f64,
    first_turn_cpu_us: f64,
    turns_per_s: f64,
    turn_cpu_us: f64,
    admission_rps: f64,
    admission_cpu_us: f64,
}

/// Streams admitted (and kept open) in a round's admission measurement.
const ADMISSIONS: usize = 2_000;

async fn round(target: &Target, kernel: &SyntheticKernel, z: Sizes) -> Result<Round> {
    let g = Arc::new(start(target, kernel).await?);
    let c = client();
    // Warm-up: connections, allocator, the kernel client's pool.
    run(&c, &g, "warm", "deltas:2000", |_| {}).await?;
    let pid = g.child.id();
    let cpu_before = cpu_ms(pid);
    let t = Instant::now();
    let n = run(&c, &g, "tp", &format!("deltas:{}", z.throughput), |_| {}).await?;
    let throughput_eps = n as f64 / t.elapsed().as_secs_f64();
    let fan_in_s = fan_in(&c, &g, z).await?;
    let events = z.throughput + (z.fan_runs as u64) * z.fan_deltas;
    let event_cpu_us = cpu_ms(pid).saturating_sub(cpu_before) as f64 * 1000.0 / events as f64;
    let (threads, turns) = (z.turn_threads, z.turns);
    let cpu_before = cpu_ms(pid);
    let first_turns_per_s = threads::turn_rate(&c, &g, threads, 0..1, z.turn_concurrency).await?;
    let first_turn_cpu_us = cpu_ms(pid).saturating_sub(cpu_before) as f64 * 1000.0 / threads as f64;
    let cpu_before = cpu_ms(pid);
    let turns_per_s = threads::turn_rate(&c, &g, threads, 1..1 + turns, z.turn_concurrency).await?;
    let turn_cpu_us =
        cpu_ms(pid).saturating_sub(cpu_before) as f64 * 1000.0 / (threads * turns) as f64;
    let parked = park(&c, &g, ADMISSIONS.min(z.parked)).await?;
    Ok(Round {
        first_turns_per_s,
        first_turn_cpu_us,
        admission_rps: parked.rps,
        admission_cpu_us: parked.cpu_us,
        throughput_eps,
        fan_in_s,
        event_cpu_us,
        turns_per_s,
        turn_cpu_us,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub(crate) async fn compare(
    base: Target,
    variant: Target,
    label: &str,
    kernel: &SyntheticKernel,
    z: Sizes,
    rounds: usize,
) -> Result<()> {
    let mut figures: [Vec<Round>; 2] = [vec![], vec![]];
    for r in 0..rounds {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let target = if i == 0 { &base } else { &variant };
            let got = round(target, kernel, z).await?;
            println!(
                "  round {} {:<8} {:>9.0} events/s  fan-in {:.3} s  {:.2} µs CPU/event  {:.0} first turns/s  {:.0} µs CPU/first turn  {:.0} turns/s  {:.0} µs CPU/turn  {:.0} admissions/s  {:.0} µs CPU/admission",
                r + 1,
                if i == 0 { "base" } else { "variant" },
                got.throughput_eps,
                got.fan_in_s,
                got.event_cpu_us,
                got.first_turns_per_s,
                got.first_turn_cpu_us,
                got.turns_per_s,
                got.turn_cpu_us,
                got.admission_rps,
                got.admission_cpu_us
            );
            figures[i].push(got);
        }
    }
    let med = |i: usize, f: fn(&Round) -> f64| median(figures[i].iter().map(f).collect());
    println!("== medians over {rounds} rounds (variant: {label})");
    for (name, f, unit) in [
        (
            "throughput",
            (|r: &Round| r.throughput_eps) as fn(&Round) -> f64,
            "events/s",
        ),
        ("fan-in", |r: &Round| r.fan_in_s, "s"),
        ("CPU per event", |r: &Round| r.event_cpu_us, "µs"),
        ("first turns", |r: &Round| r.first_turns_per_s, "turns/s"),
        ("CPU/1st turn", |r: &Round| r.first_turn_cpu_us, "µs"),
        ("turns", |r: &Round| r.turns_per_s, "turns/s"),
        ("CPU per turn", |r: &Round| r.turn_cpu_us, "µs"),
        ("admissions", |r: &Round| r.admission_rps, "runs/s"),
        ("CPU/admission", |r: &Round| r.admission_cpu_us, "µs"),
    ] {
        let (b, v) = (med(0, f), med(1, f));
        println!(
            "  {name:<14} base {b:>10.3} {unit}   variant {v:>10.3} {unit}   variant/base {:.3}",
            v / b.max(1e-9)
        );
    }
    Ok(())
}
