//! The URLs the configuration names, read by the URL standard (the `url` crate).

use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// `text` (trimmed) as an absolute URL that the URL standard and `http::Uri` read alike: the
/// kernel client and the forwarder reach a URL through one or the other, so a check made on one
/// reading holds for the connection. This refuses what only the standard would take: `http:host`,
/// another spelling of an address (`127.1`, `[0:0::1]`), `%`-escapes or `\` in the host.
pub fn parse(text: &str) -> Option<Url> {
    let text = text.trim();
    let url = Url::parse(text).ok()?;
    let uri: http::Uri = text.parse().ok()?;
    let same =
        |a: Option<&str>, b: Option<&str>| a.zip(b).is_some_and(|(a, b)| a.eq_ignore_ascii_case(b));
    (same(uri.scheme_str(), Some(url.scheme())) && same(uri.host(), url.host_str())).then_some(url)
}

/// Whether `url` is plain `http://` or `https://`.
pub fn is_http(url: &Url) -> bool {
    matches!(url.scheme(), "http" | "https")
}

/// Whether the host of `url` is one of the three a kernel may be reached at: `127.0.0.1`, `::1`
/// or `localhost` (however they are spelt).
pub fn is_kernel_host(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d == "localhost",
        Some(Host::Ipv4(a)) => a == Ipv4Addr::LOCALHOST,
        Some(Host::Ipv6(a)) => a == Ipv6Addr::LOCALHOST,
        None => false,
    }
}

/// Whether only this machine reaches the host of `url`: `localhost` or a loopback address.
pub fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Domain(d)) => d == "localhost",
        Some(Host::Ipv4(a)) => a.is_loopback(),
        Some(Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    }
}

/// `text` with its password (in the user part or a `password` parameter) replaced, for logs and
/// `Debug`; a URL that does not parse is hidden whole.
pub fn redacted(text: &str) -> String {
    const HIDDEN: &str = "***";
    let Ok(mut url) = Url::parse(text) else {
        return HIDDEN.to_owned();
    };
    if url.password().is_some() && url.set_password(Some(HIDDEN)).is_err() {
        return HIDDEN.to_owned();
    }
    if url.query_pairs().any(|(k, _)| k == "password") {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" { HIDDEN.into() } else { v };
                (k.into_owned(), v.into_owned())
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_parses_when_both_readings_agree() {
        for ok in [
            "http://127.0.0.1:8000/",
            "  https://h/x?y#z ",
            "HTTP://h",
            "postgres://u:p@h:5432/db",
        ] {
            assert!(parse(ok).is_some(), "{ok}");
        }
        for bad in [
            "http:host",
            "http:/host",
            "http:\\\\host",
            "127.0.0.1:80",
            "localhost:80",
            "nope",
            "",
            "http://",
            "http://h:99999/",
            "http://h:x/",
            "\u{1}http://h/",
            "ht\ttp://h/",
            "http://127.1/",
            "http://2130706433/",
            "http://[0:0:0:0:0:0:0:1]/",
            "http://%6cocalhost/",
            "http://127.0.0.1./",
            "http://127.0.0.1\\@example.com/",
            "http://h/a b",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn kernel_hosts_are_the_three_loopback_names() {
        let kernel = |u: &str| parse(u).is_some_and(|u| is_kernel_host(&u));
        for ok in [
            "http://127.0.0.1/",
            "http://LOCALHOST:1",
            "http://[::1]:9/",
            "http://user:pw@127.0.0.1/",
            "http://10.0.0.1@127.0.0.1/",
        ] {
            assert!(kernel(ok), "{ok}");
        }
        for bad in [
            "http://127.0.0.2/",
            "http://10.0.0.1:41242/",
            "http://example.com/",
            "http://127.0.0.1@example.com/",
            "http://127.0.0.1:80@example.com/",
            "http://localhost.example.com/",
            "http://[::2]/",
            "file:///tmp/x",
        ] {
            assert!(!kernel(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_is_any_loopback_address_or_localhost() {
        let lo = |u: &str| parse(u).is_some_and(|u| is_loopback(&u));
        assert!(lo("http://127.0.0.5:8000/"));
        assert!(lo("http://[::1]:8000/"));
        assert!(lo("http://localhost:8000/"));
        assert!(!lo("http://10.0.0.5:8000/"));
        assert!(!lo("http://gw.example:8000/"));
        assert!(!lo("http://[::]:8000/"));
    }

    #[test]
    fn redaction_hides_passwords_only() {
        assert_eq!(
            redacted("postgres://agui:s3cret@db:5432/agui"),
            "postgres://agui:***@db:5432/agui"
        );
        assert_eq!(
            redacted("postgres://agui@db/agui?sslmode=disable&password=s3cret"),
            "postgres://agui@db/agui?sslmode=disable&password=***"
        );
        assert_eq!(
            redacted("postgres://agui@db/agui"),
            "postgres://agui@db/agui"
        );
        assert_eq!(redacted("postgres://a:s3cret@h1:1,h2:2/db"), "***");
    }
}
