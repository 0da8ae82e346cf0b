//! How callers prove who they are (the book's "Authentication"): the service token
//! (`IAC_CODE_AGUI_AUTH_TOKEN`, read with the other tokens) and, with `--auth-jwks`, JWTs from an
//! identity provider: its key set (a file, or an `http(s)://` URL), the issuer and audience a
//! token must name, the claim that names its user, and how often the key set is read again.

use std::path::PathBuf;
use std::time::Duration;

use super::layers::{Layers, Number, Opt, Text};

/// The JWT options (`jwks: None`: JWTs are not accepted).
#[derive(Clone, PartialEq)]
pub struct JwtConfig {
    /// A JWKS file's path or URL.
    pub jwks: Option<String>,
    pub issuer: Option<String>,
    pub audience: Option<String>,
    /// The claim that names the user [default: `sub`].
    pub user_claim: String,
    /// How often the key set is read again [default: 300 s].
    pub jwks_refresh: Duration,
}

impl std::fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A key set URL's query may hold a key of the identity provider's: not shown.
        let jwks = self.jwks.as_deref().map(|j| Origin::parse(j).to_string());
        f.debug_struct("JwtConfig")
            .field("jwks", &jwks)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("user_claim", &self.user_claim)
            .field("jwks_refresh", &self.jwks_refresh)
            .finish()
    }
}

impl Default for JwtConfig {
    fn default() -> JwtConfig {
        JwtConfig {
            jwks: None,
            issuer: None,
            audience: None,
            user_claim: "sub".into(),
            jwks_refresh: Duration::from_secs(300),
        }
    }
}

pub(super) const JWKS_REFRESH_ERR: &str =
    "--auth-jwks-refresh must be a number of seconds from 1 to 86400.";
const NEEDS: &str = "--auth-jwks needs --auth-issuer and --auth-audience: a token from the same \
                     identity provider for another application must not be accepted.";
const CLAIM_ERR: &str =
    "--auth-user-claim must be a claim name (letters, digits, '_', '-', '.', ':', '/').";

const JWKS: Opt<Text> = Opt::new("auth_jwks", "--auth-jwks must be a string.");
const ISSUER: Opt<Text> = Opt::new("auth_issuer", "--auth-issuer must be a string.");
const AUDIENCE: Opt<Text> = Opt::new("auth_audience", "--auth-audience must be a string.");
const USER_CLAIM: Opt<Text> = Opt::new("auth_user_claim", "--auth-user-claim must be a string.");
const REFRESH: Opt<Number> = Opt::new("auth_jwks_refresh", JWKS_REFRESH_ERR);

/// The flags of the JWT options (each `None` when not given), in [`JwtConfig`] order.
pub(super) type Flags = [Option<String>; 5];

/// The JWT options from their layers, checked together: issuer and audience are required with a
/// key set (an identity provider signs tokens for many applications with the same keys).
pub(super) fn load(l: &Layers<'_>, flags: Flags) -> Result<JwtConfig, String> {
    let [jwks, issuer, audience, claim, refresh] = flags;
    let d = JwtConfig::default();
    let jwks = l.get(&JWKS, jwks)?.map(|s| s.trim().to_owned());
    let issuer = l.get(&ISSUER, issuer)?;
    let audience = l.get(&AUDIENCE, audience)?;
    let user_claim = l.get(&USER_CLAIM, claim)?.unwrap_or(d.user_claim);
    let ok_claim = |c: &str| {
        c.len() <= 128
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b))
    };
    if !ok_claim(&user_claim) {
        return Err(CLAIM_ERR.to_owned());
    }
    let refresh = l.get(&REFRESH, refresh)?.unwrap_or(300.0);
    if !(1.0..=86400.0).contains(&refresh) {
        return Err(JWKS_REFRESH_ERR.to_owned());
    }
    if let Some(j) = jwks.as_deref() {
        check_jwks_url(j)?;
    }
    if jwks.is_some() && (issuer.is_none() || audience.is_none()) {
        return Err(NEEDS.to_owned());
    }
    Ok(JwtConfig {
        jwks,
        issuer,
        audience,
        user_claim,
        jwks_refresh: Duration::from_secs_f64(refresh),
    })
}

/// A key set fetched over the network comes over https: whoever can change it in transit can
/// sign any user's token. Plain http only to a loopback address.
fn check_jwks_url(j: &str) -> Result<(), String> {
    if !j
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("http://"))
    {
        return Ok(());
    }
    match crate::urls::parse(j) {
        Some(u) if crate::urls::is_loopback(&u) => Ok(()),
        _ => Err(
            "--auth-jwks must be an https:// URL (http:// only on a loopback address) or a \
                  file's path."
                .into(),
        ),
    }
}

/// Where a key set is read from (`--auth-jwks`; shown without what a URL may carry of
/// credentials).
#[derive(Clone, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    Url(String),
}

impl Origin {
    /// `http://…` or `https://…` is a URL; anything else a file's path.
    pub fn parse(s: &str) -> Origin {
        let lower = s.get(..8).unwrap_or(s).to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            Origin::Url(s.to_owned())
        } else {
            Origin::File(PathBuf::from(s))
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            // A URL's user and password, and its query, may carry a key of the identity
            // provider's: not shown.
            Origin::Url(u) => match url::Url::parse(u) {
                Ok(mut url) => {
                    let _ = url.set_password(None);
                    let _ = url.set_username("");
                    url.set_query(None);
                    url.set_fragment(None);
                    f.write_str(url.as_str())
                }
                Err(_) => f.write_str("(a key set URL that does not parse)"),
            },
        }
    }
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Origin({self})")
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Cli, Config};
    use clap::Parser as _;

    fn load(args: &[&str], yaml: Option<&str>) -> Result<Config, String> {
        let dir = tempfile::tempdir().unwrap();
        let mut argv = vec!["iac-code-agui".to_owned()];
        if let Some(y) = yaml {
            let p = dir.path().join("c.yaml");
            std::fs::write(&p, y).unwrap();
            argv.push("--config".into());
            argv.push(p.to_string_lossy().into_owned());
        }
        argv.extend(args.iter().map(|s| s.to_string()));
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        Config::load(cli, &|_| None)
    }

    #[test]
    fn jwts_are_off_by_default() {
        let c = load(&[], None).unwrap();
        assert_eq!(c.jwt, super::JwtConfig::default());
        assert!(!c.has_auth());
    }

    #[test]
    fn a_key_set_needs_an_issuer_and_an_audience() {
        let e = load(&["--auth-jwks", "/k.json"], None).unwrap_err();
        assert!(e.contains("--auth-issuer and --auth-audience"), "{e}");
        let e = load(&["--auth-jwks", "/k.json", "--auth-issuer", "i"], None).unwrap_err();
        assert!(e.contains("--auth-audience"), "{e}");
        let c = load(
            &[
                "--auth-jwks",
                "/k.json",
                "--auth-issuer",
                "https://idp",
                "--auth-audience",
                "agui",
                "--auth-user-claim",
                "email",
                "--auth-jwks-refresh",
                "60",
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.jwt.jwks.as_deref(), Some("/k.json"));
        assert_eq!(c.jwt.issuer.as_deref(), Some("https://idp"));
        assert_eq!(c.jwt.audience.as_deref(), Some("agui"));
        assert_eq!(c.jwt.user_claim, "email");
        assert_eq!(c.jwt.jwks_refresh.as_secs(), 60);
        assert!(c.has_auth());
    }

    #[test]
    fn yaml_keys_and_bad_values() {
        let c = load(
            &[],
            Some("auth-jwks: /k.json\nauth_issuer: i\nauth_audience: a\n"),
        )
        .unwrap();
        assert_eq!(c.jwt.jwks.as_deref(), Some("/k.json"));
        for (args, needle) in [
            (&["--auth-jwks-refresh", "0"][..], "--auth-jwks-refresh"),
            (&["--auth-jwks-refresh", "x"][..], "--auth-jwks-refresh"),
            (&["--auth-user-claim", "a b"][..], "--auth-user-claim"),
        ] {
            let e = load(args, None).unwrap_err();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let e = load(&["--auth-jwks", "http://idp.example/keys"], None).unwrap_err();
        assert!(e.contains("https://"), "{e}");
        for ok in [
            "http://127.0.0.1:9/keys",
            "https://idp.example/keys",
            "/etc/jwks.json",
        ] {
            assert_eq!(super::check_jwks_url(ok), Ok(()), "{ok}");
        }
        let e = load(&[], Some("auth_issuer: 5\n")).unwrap_err();
        assert_eq!(e, "--auth-issuer must be a string.");
    }
}
