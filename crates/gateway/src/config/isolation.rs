//! Whose kernel runs a user's turns (the book's "Tenants"): every user's in shared kernels
//! (`shared`, the default), or each user's in a kernel of their own, confined by Landlock
//! (`user`); how long an idle user's kernel lives; the uid kernels run as; the TCP ports they may
//! connect to.

use std::time::Duration;

use super::layers::{Layers, List, Number, Opt, Text};

/// `--kernel-isolation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Every user's turns in the same kernels (the reference's way).
    Shared,
    /// Each user's turns in a kernel of their own.
    User,
}

/// `--kernel-start`: how a user's kernel is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Forked by the kernel fork server, which imported the kernel once (spawned while it
    /// starts, or where it cannot run).
    Fork,
    /// A new `iac-code a2a` process.
    Spawn,
}

/// The isolation options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    pub mode: Mode,
    /// A user's kernel without runs for this long is stopped [default: 900 s].
    pub idle_stop: Duration,
    /// The uid and gid kernels run as (`--kernel-user UID[:GID]`); none: the gateway's.
    pub user: Option<(u32, u32)>,
    /// The TCP ports a user's kernel may connect to; none given: 443 and the port of the
    /// kernel's LLM base URL.
    pub connect_ports: Option<Vec<u16>>,
    /// How a user's kernel is started [default: fork].
    pub start: Start,
}

impl Default for Isolation {
    fn default() -> Isolation {
        Isolation {
            mode: Mode::Shared,
            idle_stop: Duration::from_secs(900),
            user: None,
            connect_ports: None,
            start: Start::Fork,
        }
    }
}

pub(super) const MODE_ERR: &str = "--kernel-isolation must be shared or user.";
pub(super) const IDLE_ERR: &str =
    "--kernel-idle-stop must be a number of seconds from 1 to 604800.";
pub(super) const USER_ERR: &str = "--kernel-user must be a numeric UID, or UID:GID, other than 0.";
pub(super) const PORTS_ERR: &str =
    "--kernel-connect-ports must be a list of TCP ports from 1 to 65535.";
pub(super) const START_ERR: &str = "--kernel-start must be fork or spawn.";
pub(super) const EXTERNAL: &str = "--kernel-isolation user needs managed kernels: it cannot \
                                   be used with --a2a-url (an external kernel cannot be confined).";

const MODE: Opt<Text> = Opt::new("kernel_isolation", MODE_ERR);
const IDLE: Opt<Number> = Opt::new("kernel_idle_stop", IDLE_ERR);
const USER: Opt<Text> = Opt::new("kernel_user", USER_ERR);
const PORTS: Opt<List> = Opt::new("kernel_connect_ports", PORTS_ERR);
const START: Opt<Text> = Opt::new("kernel_start", START_ERR);

/// The flags of the isolation options, in [`Isolation`] order.
pub(super) type Flags = (
    Option<String>,
    Option<String>,
    Option<String>,
    Vec<String>,
    Option<String>,
);

/// The isolation options from their layers; `external`: the kernels are `--a2a-url`s.
pub(super) fn load(l: &Layers<'_>, flags: Flags, external: bool) -> Result<Isolation, String> {
    let (mode, idle, user, ports, start) = flags;
    let d = Isolation::default();
    let mode = match l.get(&MODE, mode)?.map(|m| m.trim().to_ascii_lowercase()) {
        None => d.mode,
        Some(m) if m == "shared" => Mode::Shared,
        Some(m) if m == "user" => Mode::User,
        Some(_) => return Err(MODE_ERR.into()),
    };
    if mode == Mode::User && external {
        return Err(EXTERNAL.into());
    }
    let idle_stop = match l.get(&IDLE, idle)? {
        None => d.idle_stop,
        Some(s) if (1.0..=604_800.0).contains(&s) => Duration::from_secs_f64(s),
        Some(_) => return Err(IDLE_ERR.into()),
    };
    let user = l.get(&USER, user)?.map(|u| ids(&u)).transpose()?;
    let connect_ports = l
        .get(&PORTS, Some(ports))?
        .map(|list| {
            list.iter()
                .map(|p| p.trim().parse::<u16>().ok().filter(|&p| p > 0))
                .collect::<Option<Vec<u16>>>()
                .ok_or_else(|| PORTS_ERR.to_owned())
        })
        .transpose()?;
    let start = match l.get(&START, start)?.map(|m| m.trim().to_ascii_lowercase()) {
        None => d.start,
        Some(m) if m == "fork" => Start::Fork,
        Some(m) if m == "spawn" => Start::Spawn,
        Some(_) => return Err(START_ERR.into()),
    };
    Ok(Isolation {
        mode,
        idle_stop,
        user,
        connect_ports,
        start,
    })
}

/// `UID` or `UID:GID` (the gid is the uid's number when not given); never root.
fn ids(text: &str) -> Result<(u32, u32), String> {
    let num = |s: &str| s.trim().parse::<u32>().ok().filter(|&n| n != 0);
    let (uid, gid) = match text.split_once(':') {
        Some((u, g)) => (num(u), num(g)),
        None => (num(text), num(text)),
    };
    uid.zip(gid).ok_or_else(|| USER_ERR.to_owned())
}

/// The ports a user's kernel may connect to when none are configured: 443 and the port of
/// `base_url` (the kernel's `IAC_CODE_BASE_URL`), its scheme's when it names none.
pub fn default_connect_ports(base_url: Option<&str>) -> Vec<u16> {
    let mut ports = vec![443];
    if let Some(u) = base_url.and_then(|u| url::Url::parse(u).ok()) {
        if let Some(p) = u.port_or_known_default() {
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::super::layers::YamlFile;
    use super::*;

    fn load_with(flags: Flags, yaml: Option<&str>, external: bool) -> Result<Isolation, String> {
        let file = match yaml {
            Some(y) => YamlFile::parse(y).unwrap(),
            None => YamlFile::default(),
        };
        let env = |_: &str| None;
        let l = Layers {
            file: &file,
            env: &env,
        };
        load(&l, flags, external)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.into())
    }

    #[test]
    fn shared_is_the_default_and_user_is_taken_from_a_flag_or_yaml() {
        assert_eq!(
            load_with((None, None, None, vec![], None), None, false),
            Ok(Isolation::default())
        );
        let i = load_with(
            (
                s("user"),
                s("60"),
                s("1000:1001"),
                vec!["443".into(), "8080".into()],
                s("spawn"),
            ),
            None,
            false,
        )
        .unwrap();
        assert_eq!(
            i,
            Isolation {
                mode: Mode::User,
                idle_stop: Duration::from_secs(60),
                user: Some((1000, 1001)),
                connect_ports: Some(vec![443, 8080]),
                start: Start::Spawn,
            }
        );
        let yaml = "kernel_isolation: user\nkernel-idle-stop: 5\nkernel_user: \"4242\"\n\
                    kernel_connect_ports: \"443\"\n";
        let i = load_with((None, None, None, vec![], None), Some(yaml), false).unwrap();
        assert_eq!(
            (i.mode, i.idle_stop, i.user, i.connect_ports),
            (
                Mode::User,
                Duration::from_secs(5),
                Some((4242, 4242)),
                Some(vec![443])
            )
        );
    }

    #[test]
    fn wrong_values_and_external_kernels_are_refused() {
        let none = || (None, None, None, vec![], None);
        for bad in ["clone", "forks", "Fork server"] {
            let f = (None, None, None, vec![], s(bad));
            assert_eq!(load_with(f, None, false), Err(START_ERR.into()), "{bad}");
        }
        let with_mode = |m: &str| (s(m), None, None, vec![], None);
        assert_eq!(
            load_with(with_mode("users"), None, false),
            Err(MODE_ERR.into())
        );
        assert_eq!(
            load_with(with_mode("user"), None, true),
            Err(EXTERNAL.into())
        );
        assert!(load_with(with_mode("shared"), None, true).is_ok());
        for bad in ["0", "-1", "604801", "x"] {
            let f = (None, s(bad), None, vec![], None);
            assert_eq!(load_with(f, None, false), Err(IDLE_ERR.into()), "{bad}");
        }
        for bad in ["0", "root", "0:5", "5:0", "1:2:3", "-4"] {
            let f = (None, None, s(bad), vec![], None);
            assert_eq!(load_with(f, None, false), Err(USER_ERR.into()), "{bad}");
        }
        for bad in ["0", "65536", "http"] {
            let f = (None, None, None, vec![bad.into()], None);
            assert_eq!(load_with(f, None, false), Err(PORTS_ERR.into()), "{bad}");
        }
        assert!(load_with(none(), None, true).is_ok());
    }

    #[test]
    fn the_default_ports_are_https_and_the_llms() {
        assert_eq!(default_connect_ports(None), [443]);
        assert_eq!(
            default_connect_ports(Some("http://127.0.0.1:8123/v1")),
            [443, 8123]
        );
        assert_eq!(default_connect_ports(Some("https://llm.example/v1")), [443]);
        assert_eq!(
            default_connect_ports(Some("http://llm.example/v1")),
            [443, 80]
        );
        assert_eq!(default_connect_ports(Some("not a url")), [443]);
    }
}
