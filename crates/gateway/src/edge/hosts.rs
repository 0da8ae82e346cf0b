//! The `Host` allow-list: the defence against DNS rebinding.
//!
//! A web page can make its own name resolve, a moment later, to 127.0.0.1 or to the gateway's
//! LAN address (DNS rebinding): its scripts then call the gateway as their own origin and read
//! the answers, and a gateway without a token would run whatever they ask. The browser still
//! names the page's site in `Host`, and that is what is checked.
//!
//! Allowed without configuration:
//! - a request without `Host` (HTTP/1.0; no browser sends one);
//! - an IP address (`127.0.0.1`, `[::1]`, `10.0.0.5`): an address cannot be rebound, a page
//!   served from an address is sent to that address (so a Kubernetes probe, which sends the
//!   pod's address, or a client using the address passes);
//! - `localhost` and `*.localhost` (browsers resolve them to loopback themselves);
//! - the bind host (`--host`) and the advertised URL's host (`--advertise-url`: what the other
//!   instances send when they forward a request).
//!
//! Configured (`--allowed-host`): a name, `.example.com` for a domain and its subdomains, or `*`
//! for any. Every port is allowed. The check applies only when no authentication is configured:
//! with a service token or a JWT key set, every route but `/health` requires a bearer
//! credential, and a browser never attaches one on its own, so a page that rebinds a name gets
//! nothing from the gateway either way (`http`).

use axum::http::{header, HeaderMap, Uri};

/// The message of an invalid `--allowed-host` entry.
pub const INVALID: &str = "--allowed-host must be a host name (such as agui.example.com, or \
                           .example.com for a domain and its subdomains), an IP address or *.";

/// The host names requests may carry (in lower case, without a trailing dot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts {
    /// `*` was configured.
    any: bool,
    /// Exact names.
    names: Vec<String>,
    /// Domains whose subdomains are allowed too (from `.example.com`, kept as `example.com`).
    domains: Vec<String>,
}

impl Default for AllowedHosts {
    fn default() -> AllowedHosts {
        AllowedHosts {
            any: false,
            names: Vec::new(),
            domains: vec!["localhost".to_owned()],
        }
    }
}

/// What a `Host` value names.
#[derive(Debug, PartialEq, Eq)]
enum Named {
    Address,
    Name(String),
}

/// A name as compared: lower case, one trailing dot dropped (`localhost.` is `localhost`).
fn normal(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// A DNS name's characters (letters, digits, `-`, `_`, `.`), not empty, no empty label.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|l| !l.is_empty())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The host of `host[:port]` (a `Host` value or a URI authority); `None` when it is neither an
/// address nor a name.
fn parse(value: &str) -> Option<Named> {
    if let Some(rest) = value.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        let port_ok = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
        return (port_ok && v6.parse::<std::net::Ipv6Addr>().is_ok()).then_some(Named::Address);
    }
    let host = match value.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return None,
        None => value,
    };
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some(Named::Address);
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    is_name(host).then(|| Named::Name(host.to_ascii_lowercase()))
}

impl AllowedHosts {
    /// The configured entries (`--allowed-host`), with the bind host and the advertised URL's
    /// host; the first invalid entry is the error.
    pub fn new<S: AsRef<str>>(
        configured: &[S],
        bind_host: &str,
        advertise_url: &str,
    ) -> Result<AllowedHosts, String> {
        let mut out = AllowedHosts::default();
        for raw in configured {
            let entry = raw.as_ref().trim();
            if entry == "*" {
                out.any = true;
            } else if let Some(domain) = entry.strip_prefix('.') {
                if !is_name(domain.strip_suffix('.').unwrap_or(domain)) {
                    return Err(INVALID.into());
                }
                out.add_domain(normal(domain));
            } else {
                // A name or an address, without a port: `host:port` is refused, so that a port
                // is never silently ignored.
                let bracketed = entry.starts_with('[') && entry.ends_with(']');
                match parse(entry) {
                    Some(Named::Name(n)) if !entry.contains(':') => out.add_name(n),
                    Some(Named::Address) if bracketed || !entry.contains(':') => {}
                    _ => return Err(INVALID.into()),
                }
            }
        }
        // The bind host (a name: an address is allowed anyway; a wildcard is an address).
        if let Some(Named::Name(n)) = parse(bind_host.trim()) {
            out.add_name(n);
        }
        if let Some(u) = crate::urls::parse(advertise_url) {
            if let Some(url::Host::Domain(d)) = u.host() {
                out.add_name(normal(d));
            }
        }
        Ok(out)
    }

    fn add_name(&mut self, n: String) {
        if !self.names.contains(&n) {
            self.names.push(n);
        }
    }

    fn add_domain(&mut self, d: String) {
        if !self.domains.contains(&d) {
            self.domains.push(d);
        }
    }

    /// Whether `*` was configured.
    pub fn any(&self) -> bool {
        self.any
    }

    /// Whether a `Host` value (or a URI authority) names an allowed host.
    pub fn allows_value(&self, value: &str) -> bool {
        match parse(value) {
            None => false,
            Some(Named::Address) => true,
            Some(Named::Name(n)) => {
                self.any
                    || self.names.contains(&n)
                    || self.domains.iter().any(|d| {
                        n == *d
                            || n.strip_suffix(d.as_str())
                                .is_some_and(|head| head.ends_with('.'))
                    })
            }
        }
    }

    /// Whether a request names an allowed host: its `Host` field and, in the absolute form
    /// (`POST http://host/ HTTP/1.1`), its target's authority. A request that names none passes.
    pub fn allows(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        if self.any {
            return true;
        }
        let mut fields = headers.get_all(header::HOST).iter();
        let host_ok = match (fields.next(), fields.next()) {
            (None, _) => true,
            (Some(v), None) => v.to_str().is_ok_and(|v| self.allows_value(v.trim())),
            // Two `Host` fields: hyper passes them on; nobody may choose which one counts.
            (Some(_), Some(_)) => false,
        };
        host_ok
            && uri
                .authority()
                .is_none_or(|a| self.allows_value(a.as_str().rsplit('@').next().unwrap_or("")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn hosts(list: &[&str]) -> AllowedHosts {
        AllowedHosts::new(list, "127.0.0.1", "http://127.0.0.1:8000/").unwrap()
    }

    #[test]
    fn addresses_and_loopback_names_pass_without_configuration() {
        let h = hosts(&[]);
        for ok in [
            "127.0.0.1",
            "127.0.0.1:8000",
            "localhost",
            "LocalHost:1",
            "localhost.:8000",
            "app.localhost:3000",
            "[::1]",
            "[::1]:8000",
            "10.0.0.5:8000",
            "[fe80::1]:80",
            "0.0.0.0",
        ] {
            assert!(h.allows_value(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8000",
            "localhost.evil.example",
            "evillocalhost",
            "127.0.0.1.evil.example",
            "127.1",
            "",
            ":80",
            "::1",
            "[::1",
            "[::1]x",
            "[nope]:80",
            "a b",
            "host:port",
            "a..b",
            "user@localhost",
        ] {
            assert!(!h.allows_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn configured_names_domains_and_any() {
        let h = hosts(&["AGUI.example.com", ".corp.example", "10.1.2.3", "[::2]"]);
        assert!(h.allows_value("agui.example.com:443"));
        assert!(h.allows_value("agui.example.com."));
        assert!(!h.allows_value("x.agui.example.com"));
        assert!(h.allows_value("corp.example"));
        assert!(h.allows_value("a.b.corp.example:8000"));
        assert!(!h.allows_value("evilcorp.example"));
        assert!(!h.any());
        let any = hosts(&["*"]);
        assert!(any.any() && any.allows_value("anything.example"));
        for bad in [
            "agui.example.com:8000",
            "http://agui.example.com",
            "agui.example.com/x",
            ".",
            "..x",
            "a b",
            "::1",
            "",
        ] {
            assert_eq!(
                AllowedHosts::new(&[bad], "127.0.0.1", "").unwrap_err(),
                INVALID,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_bind_host_and_the_advertised_host_pass() {
        let h =
            AllowedHosts::new::<&str>(&[], "gw.internal", "http://gw-7.pods.local:8000/").unwrap();
        assert!(h.allows_value("gw.internal:8000"));
        assert!(h.allows_value("GW-7.pods.local:8000"));
        assert!(!h.allows_value("other.internal"));
        // A wildcard bind and no advertised URL add nothing.
        assert_eq!(
            AllowedHosts::new::<&str>(&[], "0.0.0.0", "").unwrap(),
            AllowedHosts::default()
        );
    }

    #[test]
    fn a_request_is_judged_by_its_host_field_and_its_absolute_target() {
        let h = hosts(&[]);
        let req = |target: &str, host_fields: &[&str]| {
            let uri: Uri = target.parse().unwrap();
            let mut headers = HeaderMap::new();
            for v in host_fields {
                headers.append(header::HOST, HeaderValue::from_str(v).unwrap());
            }
            h.allows(&uri, &headers)
        };
        assert!(req("/", &["localhost:8000"]));
        assert!(req("/", &[]));
        assert!(!req("/", &["evil.example"]));
        assert!(!req("/", &["localhost", "evil.example"]));
        assert!(!req("/", &["localhost", "localhost"]));
        assert!(req("http://127.0.0.1:8000/", &["localhost"]));
        assert!(!req("http://evil.example/", &["localhost"]));
        assert!(!req("http://localhost/", &["evil.example"]));
        let mut bad = HeaderMap::new();
        bad.insert(header::HOST, HeaderValue::from_bytes(b"\xff").unwrap());
        assert!(!h.allows(&"/".parse().unwrap(), &bad));
    }
}
