//! The checks of the options' values once their layers have given them: pure functions, each
//! with the message of the option it checks.

use std::time::Duration;

use super::layers::Counted;
use super::LogFormat;
use crate::urls;
use kernel::environment;
use store::pg_tls;

pub(super) const PORT: &str = "--port must be between 1 and 65535.";
pub(super) const INTERRUPT_TTL: &str = "--interrupt-ttl must be a non-negative integer.";
pub(super) const REPLAY_BUFFER: &str = "--replay-buffer must be a positive integer (bytes).";
pub(super) const METRICS_LISTEN: &str = "--metrics-listen must be HOST:PORT.";
pub(super) const LOG_FORMAT: &str = "--log-format must be text or json.";
pub(super) const STATE_URL: &str = "--state-url must be a postgres:// URL.";
const STATE_VERIFY_CA: &str = "--state-url's sslmode=verify-ca needs --state-ca-file (the CA the \
     database's certificate must chain to); with public roots use sslmode=verify-full.";
pub(super) const LEASE_TTL: &str = "--lease-ttl must be a number of seconds, at least 1.";
pub(super) const CLIENT_STALL_TIMEOUT: &str =
    "--client-stall-timeout must be a positive number of seconds.";
pub(super) const BODY_TIMEOUT: &str = "--body-timeout must be a positive number of seconds.";
pub(super) const ADVERTISE_URL: &str =
    "--advertise-url must be an http:// URL (https:// when the listener serves TLS).";
const ADVERTISE_NEEDED: &str =
    "--advertise-url is needed with --state-url when --host is a wildcard address.";
pub(super) const MAX_IMAGE_DECODES: &str =
    "--max-image-decodes must be an integer between 1 and 1024.";
pub(super) const KERNELS: &str = "--kernels must be an integer between 1 and 64, or auto.";
const KERNELS_EXTERNAL: &str =
    "--kernels above 1 needs managed kernels: it cannot be used with --a2a-url.";
/// What `--kernels auto` counts a kernel to need: an idle kernel holds about 140 MiB, and its
/// sessions grow it.
pub(super) const KERNEL_MEMORY: u64 = 512 * 1024 * 1024;
pub(super) const KERNEL_ENV: &str = "--kernel-env must be a list of variable names.";
const CONSOLE_ADMIN: &str =
    "--console admin needs --metrics-listen: the console is served on the admin listener.";
const A2A_URLS_MANY: &str = "--a2a-url names at most 64 kernels.";
const A2A_URLS_TWICE: &str = "--a2a-url names one kernel twice.";
pub(super) const A2A_HTTPS: &str = "--a2a-url must be a plain http:// URL: the kernel is a \
     loopback child or a sidecar, reached without TLS (nothing but this host can see the traffic).";
pub(super) const LOOPBACK: &str =
    "The AG-UI adapter may connect only to a loopback A2A HTTP(S) URL.";

/// The longest duration an option gives, about 31 years: longer is forever in practice, and a
/// deadline that far would overflow.
const LONGEST_SECS: f64 = 1e9;

pub(super) fn port(p: i64) -> Result<u16, String> {
    u16::try_from(p)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| PORT.to_owned())
}

fn non_negative(v: f64, err: &str) -> Result<f64, String> {
    (v >= 0.0 && v.is_finite())
        .then_some(v)
        .ok_or_else(|| err.to_owned())
}

/// A non-negative number of seconds.
pub(super) fn seconds(v: f64, err: &str) -> Result<Duration, String> {
    let v = non_negative(v, err)?;
    Ok(Duration::from_secs_f64(v.min(LONGEST_SECS)))
}

pub(super) fn interrupt_ttl(v: f64) -> Result<u64, String> {
    let v = non_negative(v, INTERRUPT_TTL)?;
    if v.fract() != 0.0 {
        return Err(INTERRUPT_TTL.into());
    }
    // Like every duration: longer than about 31 years is forever (and its date would overflow).
    Ok(v.min(LONGEST_SECS) as u64)
}

pub(super) fn replay_buffer(v: f64) -> Result<usize, String> {
    let v = non_negative(v, REPLAY_BUFFER)?;
    if v < 1.0 || v.fract() != 0.0 || v > 1e12 {
        return Err(REPLAY_BUFFER.into());
    }
    Ok(v as usize)
}

pub(super) fn lease_ttl(v: f64) -> Result<Duration, String> {
    let v = non_negative(v, LEASE_TTL)?;
    if !(1.0..=86400.0).contains(&v) {
        return Err(LEASE_TTL.into());
    }
    Ok(Duration::from_secs_f64(v))
}

/// How long a client may read nothing: a bound, never zero (a wait without one would be for
/// ever).
pub(super) fn client_stall_timeout(v: f64) -> Result<Duration, String> {
    let v = non_negative(v, CLIENT_STALL_TIMEOUT)?;
    if v <= 0.0 {
        return Err(CLIENT_STALL_TIMEOUT.into());
    }
    Ok(Duration::from_secs_f64(v.min(LONGEST_SECS)))
}

/// How many images may be decoded at once: at least one (none would refuse every image), at most
/// 1024 (each decode holds up to about 150 MB).
pub(super) fn max_image_decodes(v: i64) -> Result<usize, String> {
    (1..=1024)
        .contains(&v)
        .then_some(v as usize)
        .ok_or_else(|| MAX_IMAGE_DECODES.to_owned())
}

/// How many managed kernels: 1 unless asked; `auto` one a core, as many as `memory` bytes hold
/// at [`KERNEL_MEMORY`] each (unknown memory bounds nothing), from 1 to 64. An external kernel
/// is one.
pub(super) fn kernels(
    v: Option<Counted>,
    external: bool,
    cores: i64,
    memory: Option<u64>,
) -> Result<usize, String> {
    let n = match v {
        None => 1,
        Some(Counted::N(n)) if (1..=64).contains(&n) => n as usize,
        Some(Counted::N(_)) => return Err(KERNELS.to_owned()),
        Some(Counted::Auto) if external => 1,
        Some(Counted::Auto) => {
            let fit = memory.map_or(u64::MAX, |m| m / KERNEL_MEMORY);
            (cores.max(1) as u64).min(fit).clamp(1, 64) as usize
        }
    };
    if n > 1 && external {
        return Err(KERNELS_EXTERNAL.to_owned());
    }
    Ok(n)
}

/// How long a request body may take: a bound, never zero (a body could otherwise take for ever).
pub(super) fn body_timeout(v: f64) -> Result<Duration, String> {
    let v = non_negative(v, BODY_TIMEOUT)?;
    if v <= 0.0 {
        return Err(BODY_TIMEOUT.into());
    }
    Ok(Duration::from_secs_f64(v.min(LONGEST_SECS)))
}

/// The console on the admin listener needs that listener.
pub(super) fn console(at: super::Served, admin_listener: bool) -> Result<(), String> {
    if at == super::Served::Admin && !admin_listener {
        return Err(CONSOLE_ADMIN.to_owned());
    }
    Ok(())
}

/// The external kernels' URLs, each checked by [`a2a_url`]: at most 64 (as managed kernels),
/// each once (two slots of one kernel would split its threads' placement for nothing).
pub(super) fn a2a_urls(urls: Vec<String>) -> Result<Vec<String>, String> {
    if urls.len() > 64 {
        return Err(A2A_URLS_MANY.to_owned());
    }
    let mut out = Vec::with_capacity(urls.len());
    let mut seen = std::collections::HashSet::new();
    for url in urls {
        let url = a2a_url(&url)?;
        // Compared as parsed (scheme and host in lower case, default port dropped); never
        // echoed: a URL may carry credentials.
        if !seen.insert(urls::parse(&url).map(String::from)) {
            return Err(A2A_URLS_TWICE.to_owned());
        }
        out.push(url);
    }
    Ok(out)
}

/// A loopback plain-HTTP URL of a kernel (host `127.0.0.1`, `::1` or `localhost`), normalised to
/// one trailing `/`. `https://` passes the reference's loopback rule but is refused: the kernel
/// client speaks plain HTTP, so every stream to it would fail after a clean start.
pub fn a2a_url(url: &str) -> Result<String, String> {
    let parsed = urls::parse(url);
    let loopback = parsed
        .as_ref()
        .is_some_and(|u| urls::is_http(u) && urls::is_kernel_host(u));
    if !loopback {
        return Err(LOOPBACK.into());
    }
    if parsed.is_some_and(|u| u.scheme() != "http") {
        return Err(A2A_HTTPS.into());
    }
    Ok(format!("{}/", url.trim().trim_end_matches('/')))
}

/// `HOST:PORT` (a name or an address; `[v6]:port`), port 0..=65535.
pub(super) fn listen_address(v: &str) -> Result<String, String> {
    let err = || METRICS_LISTEN.to_owned();
    let v = v.trim();
    let (host, port) = v.rsplit_once(':').ok_or_else(err)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(err());
    }
    Ok(v.to_owned())
}

pub(super) fn log_format(v: Option<&str>) -> Result<LogFormat, String> {
    match v.map(str::trim) {
        None => Ok(LogFormat::Text),
        Some(f) if f.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
        Some(f) if f.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
        Some(_) => Err(LOG_FORMAT.into()),
    }
}

/// A `postgres://` (or `postgresql://`) URL the PostgreSQL client takes once the store has taken
/// the `sslmode` it handles itself (tokio-postgres alone knows no `verify-ca` or `verify-full`);
/// that mode.
pub(super) fn state_url(u: &str) -> Result<Option<pg_tls::Mode>, String> {
    let postgres = u.starts_with("postgres://") || u.starts_with("postgresql://");
    if !postgres {
        return Err(STATE_URL.into());
    }
    let (rest, mode) = pg_tls::split_mode(u)?;
    if rest.parse::<tokio_postgres::Config>().is_err() {
        return Err(STATE_URL.into());
    }
    Ok(mode)
}

/// `verify-ca` with the CA it verifies against: public roots with any host name prove nothing.
pub(super) fn state_ca(mode: Option<pg_tls::Mode>, ca_file: bool) -> Result<(), String> {
    if mode == Some(pg_tls::Mode::VerifyCa) && !ca_file {
        return Err(STATE_VERIFY_CA.into());
    }
    Ok(())
}

/// The URL other instances reach this one at: the given one (plain `http://`, normalised to one
/// trailing `/`), else the bound host and port (a wildcard host has no address to give: empty).
pub(super) fn advertise(
    given: Option<&str>,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<String, String> {
    let scheme = if tls { "https" } else { "http" };
    if let Some(u) = given {
        let http = urls::parse(u).is_some_and(|u| u.scheme() == scheme);
        if !http {
            return Err(ADVERTISE_URL.into());
        }
        return Ok(format!("{}/", u.trim().trim_end_matches('/')));
    }
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let wildcard = h
        .parse::<std::net::IpAddr>()
        .is_ok_and(|a| a.is_unspecified());
    if wildcard {
        return Ok(String::new());
    }
    let h = if h.contains(':') {
        format!("[{h}]")
    } else {
        h.to_owned()
    };
    Ok(format!("{scheme}://{h}:{port}/"))
}

/// Several instances forward to each other: one on a wildcard host must say where.
pub(super) fn advertised(state_url: Option<&str>, advertise_url: &str) -> Result<(), String> {
    if state_url.is_some() && advertise_url.is_empty() {
        return Err(ADVERTISE_NEEDED.into());
    }
    Ok(())
}

/// Names of variables passed to the kernel: names (no `=`, no NUL), none of the gateway's own.
pub(super) fn kernel_env(names: Vec<String>) -> Result<Vec<String>, String> {
    for n in &names {
        if n.contains(['=', '\0']) {
            return Err(KERNEL_ENV.into());
        }
        if !environment::passable(n) {
            return Err(format!(
                "--kernel-env cannot pass {n}: the gateway's own {}* variables never reach the kernel.",
                environment::GATEWAY_PREFIX
            ));
        }
    }
    Ok(names)
}

/// The cluster secret, when given, has at least 32 bytes (an HMAC key guessed by nobody).
pub(super) fn cluster_secret(secret: Option<&str>) -> Result<(), String> {
    match secret {
        Some(s) if s.len() < 32 => Err(
            "IAC_CODE_AGUI_CLUSTER_SECRET must have at least 32 characters (for example the output \
             of `openssl rand -hex 32`)."
                .into(),
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(port(8000), Ok(8000));
        for bad in [0, -1, 65536] {
            assert_eq!(port(bad), Err(PORT.to_owned()));
        }
        assert_eq!(seconds(2.5, "e"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds(1e300, "e"), Ok(Duration::from_secs(1_000_000_000)));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(seconds(bad, "e"), Err("e".to_owned()));
        }
        assert_eq!(interrupt_ttl(0.0), Ok(0));
        assert_eq!(interrupt_ttl(1.5), Err(INTERRUPT_TTL.to_owned()));
        assert_eq!(replay_buffer(1.0), Ok(1));
        for bad in [0.0, 1.5, 2e12] {
            assert_eq!(replay_buffer(bad), Err(REPLAY_BUFFER.to_owned()));
        }
        assert_eq!(lease_ttl(86400.0), Ok(Duration::from_secs(86400)));
        for bad in [0.5, 86401.0] {
            assert_eq!(lease_ttl(bad), Err(LEASE_TTL.to_owned()));
        }
    }

    #[test]
    fn kernel_env_takes_names_but_not_the_gateways_own() {
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let ok = names(&["ALIBABA_CLOUD_ACCESS_KEY_ID", "OTEL_SERVICE_NAME"]);
        assert_eq!(kernel_env(ok.clone()), Ok(ok));
        assert_eq!(kernel_env(names(&["A=B"])), Err(KERNEL_ENV.to_owned()));
        let own = kernel_env(names(&["X", "IAC_CODE_AGUI_STATE_URL"])).unwrap_err();
        assert_eq!(
            own,
            "--kernel-env cannot pass IAC_CODE_AGUI_STATE_URL: the gateway's own IAC_CODE_AGUI_* \
             variables never reach the kernel."
        );
    }

    #[test]
    fn kernel_urls_are_each_checked_named_once_and_at_most_64() {
        let urls = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(a2a_urls(vec![]), Ok(vec![]));
        assert_eq!(
            a2a_urls(urls(&["http://127.0.0.1:1", "http://[::1]:2/"])),
            Ok(urls(&["http://127.0.0.1:1/", "http://[::1]:2/"]))
        );
        assert_eq!(
            a2a_urls(urls(&["http://127.0.0.1:1", "http://10.0.0.1:2/"])),
            Err(LOOPBACK.to_owned())
        );
        for twice in [
            ["http://127.0.0.1:1", "http://127.0.0.1:1/"],
            ["http://LOCALHOST:1/", "http://localhost:1"],
            ["http://127.0.0.1:80/", "http://127.0.0.1/"],
        ] {
            assert_eq!(
                a2a_urls(urls(&twice)),
                Err(A2A_URLS_TWICE.to_owned()),
                "{twice:?}"
            );
        }
        let many: Vec<String> = (1..=65).map(|p| format!("http://127.0.0.1:{p}/")).collect();
        assert_eq!(a2a_urls(many[..64].to_vec()).map(|v| v.len()), Ok(64));
        assert_eq!(a2a_urls(many), Err(A2A_URLS_MANY.to_owned()));
    }

    #[test]
    fn a_kernel_url_is_loopback_and_kept_as_written() {
        for bad in [
            "http://10.0.0.1:41242/",
            "ftp://127.0.0.1/",
            "http://example.com",
            "127.0.0.1:80",
            "http:127.0.0.1",
            "http://127.0.0.1@example.com/",
            "http://127.0.0.1:99999/",
            "",
        ] {
            assert_eq!(a2a_url(bad), Err(LOOPBACK.to_owned()), "{bad}");
        }
        for (url, want) in [
            ("http://[::1]:1/", Ok("http://[::1]:1/")),
            ("http://LOCALHOST:1", Ok("http://LOCALHOST:1/")),
            (" HTTP://127.0.0.1:9/x// ", Ok("HTTP://127.0.0.1:9/x/")),
            (" HTTPS://127.0.0.1:9/x// ", Err(A2A_HTTPS)),
        ] {
            let want = want.map(str::to_owned).map_err(str::to_owned);
            assert_eq!(a2a_url(url), want, "{url}");
        }
    }

    #[test]
    fn the_advertised_url() {
        assert_eq!(
            advertise(Some(" http://10.0.0.5:8000 "), "h", 1, false).unwrap(),
            "http://10.0.0.5:8000/"
        );
        for bad in ["https://a", "nope", "http:a", ""] {
            assert_eq!(
                advertise(Some(bad), "h", 1, false),
                Err(ADVERTISE_URL.to_owned()),
                "{bad}"
            );
        }
        assert_eq!(advertise(None, "::1", 9, false).unwrap(), "http://[::1]:9/");
        assert_eq!(advertise(None, "[::]", 9, false).unwrap(), "");
        assert_eq!(advertise(None, "0.0.0.0", 9, false).unwrap(), "");
        assert_eq!(advertise(None, "gw", 9, false).unwrap(), "http://gw:9/");
        // A listener serving TLS is advertised, and must be, with https.
        assert_eq!(advertise(None, "gw", 9, true).unwrap(), "https://gw:9/");
        let https = advertise(Some("https://10.0.0.5:8000"), "h", 1, true).unwrap();
        assert_eq!(https, "https://10.0.0.5:8000/");
        assert!(advertise(Some("http://10.0.0.5:8000"), "h", 1, true).is_err());
        assert!(advertised(Some("postgres://h/db"), "").is_err());
        assert!(advertised(None, "").is_ok());
    }

    #[test]
    fn listen_addresses_formats_and_state_urls() {
        assert_eq!(listen_address(" [::1]:0 ").unwrap(), "[::1]:0");
        for bad in ["9464", ":9464", "localhost:x", "h:70000"] {
            assert_eq!(listen_address(bad), Err(METRICS_LISTEN.to_owned()));
        }
        assert_eq!(log_format(None), Ok(LogFormat::Text));
        assert_eq!(log_format(Some(" JSON ")), Ok(LogFormat::Json));
        assert_eq!(log_format(Some("xml")), Err(LOG_FORMAT.to_owned()));
        assert_eq!(state_url("postgresql://u@h:5432/db"), Ok(None));
        for bad in ["mysql://x", "postgres://h:notaport/db"] {
            assert_eq!(state_url(bad), Err(STATE_URL.to_owned()));
        }
        // Every sslmode libpq knows, the two the gateway verifies itself among them.
        for mode in [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ] {
            let u = format!("postgres://u@db:5432/agui?sslmode={mode}&connect_timeout=3");
            assert!(state_url(&u).is_ok(), "{mode}");
        }
        let ca = state_url("postgres://u@db:5432/agui?sslmode=verify-ca").unwrap();
        assert_eq!(ca, Some(pg_tls::Mode::VerifyCa));
        assert_eq!(state_ca(ca, true), Ok(()));
        assert_eq!(state_ca(ca, false), Err(STATE_VERIFY_CA.to_owned()));
        let full = state_url("postgres://u@db:5432/agui?sslmode=verify-full").unwrap();
        assert_eq!(state_ca(full, false), Ok(()));
        let e = state_url("postgres://u@db/agui?sslmode=always").unwrap_err();
        assert!(e.contains("sslmode \"always\""), "{e}");
        // What follows the sslmode is still read by the client.
        let e = state_url("postgres://u@db/agui?sslmode=verify-full&port=x");
        assert_eq!(e, Err(STATE_URL.to_owned()));
    }
}
