//! The bounds on concurrent work: connections, runs, runs of one user, detached runs, readers of one run, guidance
//! runs of one thread; and the messages one thread's transcript keeps. Each has a flag, a variable, a YAML key and a default sized for one
//! gateway in front of one kernel on one machine; each must be a whole number from 1 to
//! [`MOST`] (a bound that could be switched off would not be one).

use super::layers::{Integer, Layers, Opt};

pub use engine::limits::Caps;

/// The largest value a bound takes: more is no bound in practice (and stays far below what a
/// semaphore counts).
pub const MOST: i64 = 1_000_000;

pub(super) const MAX_CONNECTIONS: &str =
    "--max-connections must be a whole number from 1 to 1000000.";
pub(super) const MAX_RUNS: &str = "--max-runs must be a whole number from 1 to 1000000.";
pub(super) const MAX_RUNS_PER_USER: &str =
    "--max-runs-per-user must be a whole number from 1 to 1000000.";
pub(super) const MAX_DETACHED_RUNS: &str =
    "--max-detached-runs must be a whole number from 1 to 1000000.";
pub(super) const MAX_READERS_PER_RUN: &str =
    "--max-readers-per-run must be a whole number from 1 to 1000000.";
pub(super) const MAX_GUIDANCE_PER_THREAD: &str =
    "--max-guidance-per-thread must be a whole number from 1 to 1000000.";

const CONNECTIONS: Opt<Integer> = Opt::new("max_connections", MAX_CONNECTIONS);
const RUNS: Opt<Integer> = Opt::new("max_runs", MAX_RUNS);
const RUNS_PER_USER: Opt<Integer> = Opt::new("max_runs_per_user", MAX_RUNS_PER_USER);
const DETACHED: Opt<Integer> = Opt::new("max_detached_runs", MAX_DETACHED_RUNS);
const READERS: Opt<Integer> = Opt::new("max_readers_per_run", MAX_READERS_PER_RUN);
pub(super) const TRANSCRIPT_LIMIT: &str =
    "--transcript-limit must be a whole number from 0 to 1000000.";

const TRANSCRIPT: Opt<Integer> = Opt::new("transcript_limit", TRANSCRIPT_LIMIT);
const GUIDANCE: Opt<Integer> = Opt::new("max_guidance_per_thread", MAX_GUIDANCE_PER_THREAD);

/// A bound's value: 1 to [`MOST`].
fn bound(v: i64, err: &str) -> Result<usize, String> {
    if !(1..=MOST).contains(&v) {
        return Err(err.to_owned());
    }
    usize::try_from(v).map_err(|_| err.to_owned())
}

/// The flags of the bounds (each `None` when not given), in [`Caps`] order.
pub(super) type Flags = [Option<String>; 7];

/// The bounds from their layers (flag or variable, YAML, default), in order: the first invalid
/// one is reported.
pub(super) fn load(l: &Layers<'_>, flags: Flags) -> Result<Caps, String> {
    let d = Caps::default();
    let [connections, runs, per_user, detached, readers, guidance, transcript] = flags;
    let one = |opt: &Opt<Integer>, flag, default: usize| match l.get(opt, flag)? {
        Some(v) => bound(v, opt.err()),
        None => Ok(default),
    };
    Ok(Caps {
        max_connections: one(&CONNECTIONS, connections, d.max_connections)?,
        max_runs: one(&RUNS, runs, d.max_runs)?,
        max_runs_per_user: one(&RUNS_PER_USER, per_user, d.max_runs_per_user)?,
        max_detached_runs: one(&DETACHED, detached, d.max_detached_runs)?,
        max_readers_per_run: one(&READERS, readers, d.max_readers_per_run)?,
        max_guidance_per_thread: one(&GUIDANCE, guidance, d.max_guidance_per_thread)?,
        // 0 keeps no transcript.
        transcript_limit: match l.get(&TRANSCRIPT, transcript)? {
            Some(0) => 0,
            Some(v) => bound(v, TRANSCRIPT.err())?,
            None => d.transcript_limit,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_is_a_whole_number_from_one_to_a_million() {
        assert_eq!(bound(1, MAX_RUNS), Ok(1));
        assert_eq!(bound(MOST, MAX_RUNS), Ok(1_000_000));
        for bad in [0, -1, MOST + 1, i64::MAX] {
            assert_eq!(bound(bad, MAX_RUNS), Err(MAX_RUNS.to_owned()), "{bad}");
        }
    }
}

#[cfg(test)]
mod layer_tests {
    use super::*;
    use crate::config::{Cli, Config};
    use clap::Parser as _;

    fn load(args: &[&str], env: &[(&str, &str)], yaml: Option<&str>) -> Result<Caps, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        let mut argv = vec!["iac-code-agui".to_owned()];
        if let Some(y) = yaml {
            std::fs::write(&p, y).unwrap();
            argv.extend(["--config".to_owned(), p.display().to_string()]);
        }
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        let mut cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        // clap reads the variables of the process; the test's stand in for them.
        for (k, v) in env {
            let slot = match *k {
                "IAC_CODE_AGUI_MAX_RUNS" => &mut cli.max_runs,
                "IAC_CODE_AGUI_MAX_CONNECTIONS" => &mut cli.max_connections,
                _ => unreachable!("{k}"),
            };
            slot.get_or_insert_with(|| (*v).to_owned());
        }
        Config::load(cli, &|_| None).map(|c| c.caps)
    }

    #[test]
    fn each_bound_from_its_flag_variable_or_yaml_else_its_default() {
        assert_eq!(load(&[], &[], None), Ok(Caps::default()));
        let c = load(
            &[
                "--max-connections",
                "10",
                "--max-runs",
                "2",
                "--max-detached-runs",
                "3",
                "--max-readers-per-run",
                "4",
                "--max-guidance-per-thread",
                "5",
                "--transcript-limit",
                "6",
                "--max-runs-per-user",
                "7",
            ],
            &[],
            None,
        )
        .unwrap();
        assert_eq!(
            c,
            Caps {
                max_connections: 10,
                max_runs: 2,
                max_runs_per_user: 7,
                max_detached_runs: 3,
                max_readers_per_run: 4,
                max_guidance_per_thread: 5,
                transcript_limit: 6,
            }
        );
        let yaml = "max-connections: 11\nmax_runs: 12\nmax-detached-runs: 13\n\
                    max_readers_per_run: 14\nmax-guidance-per-thread: 15\n\
                    transcript-limit: 16\nmax_runs_per_user: 17\n";
        let c = load(&[], &[], Some(yaml)).unwrap();
        assert_eq!(
            (
                c.max_connections,
                c.max_runs,
                c.max_detached_runs,
                c.max_readers_per_run,
                c.max_guidance_per_thread,
                c.transcript_limit,
                c.max_runs_per_user
            ),
            (11, 12, 13, 14, 15, 16, 17)
        );
        // The flag (or its variable) wins over YAML.
        let c = load(&["--max-runs", "7"], &[], Some("max_runs: 12\n")).unwrap();
        assert_eq!(c.max_runs, 7);
        let c = load(
            &[],
            &[("IAC_CODE_AGUI_MAX_RUNS", "9")],
            Some("max_runs: 12\n"),
        )
        .unwrap();
        assert_eq!(c.max_runs, 9);
        // An empty flag counts as unset.
        let c = load(
            &["--max-connections", ""],
            &[],
            Some("max_connections: 5\n"),
        )
        .unwrap();
        assert_eq!(c.max_connections, 5);
    }

    #[test]
    fn a_bound_that_is_no_bound_is_refused() {
        for bad in ["0", "-3", "1.5", "x", "1000001"] {
            assert_eq!(load(&["--max-runs", bad], &[], None), Err(MAX_RUNS.into()));
            assert_eq!(
                load(&["--max-connections", bad], &[], None),
                Err(MAX_CONNECTIONS.into())
            );
            if bad != "0" {
                assert_eq!(
                    load(&["--transcript-limit", bad], &[], None),
                    Err(TRANSCRIPT_LIMIT.into())
                );
            }
        }
        // 0 keeps no transcript.
        assert_eq!(
            load(&["--transcript-limit", "0"], &[], None).map(|c| c.transcript_limit),
            Ok(0)
        );
        assert_eq!(
            load(&[], &[], Some("max_detached_runs: \"3\"\n")),
            Err(MAX_DETACHED_RUNS.into())
        );
        assert_eq!(
            load(&[], &[], Some("max_readers_per_run: 0\n")),
            Err(MAX_READERS_PER_RUN.into())
        );
        assert_eq!(
            load(&[], &[], Some("max_guidance_per_thread: 2.0\n")),
            Err(MAX_GUIDANCE_PER_THREAD.into())
        );
    }
}
