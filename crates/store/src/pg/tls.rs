//! The connection to PostgreSQL over TLS: `sslmode` in `--state-url` as libpq reads it, with
//! rustls (the ring provider).
//!
//! - no `sslmode`, `disable`, `allow`, `prefer`: as before this option existed (plain TCP);
//! - `require`: encrypted, the server's certificate not checked (libpq's meaning);
//! - `verify-ca`: encrypted, the certificate signed by the CA of `--state-ca-file` (required:
//!   public roots with any host name would prove nothing), any host name;
//! - `verify-full`: `verify-ca`, and the certificate names the host connected to.
//!
//! A server that does not offer TLS is refused with the three last (tokio-postgres's `require`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

/// How the connection is encrypted and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Require,
    VerifyCa,
    VerifyFull,
}

/// `url` without a `sslmode` the gateway handles itself, and that mode (`None`: plain, as before).
/// Other parameters and other modes stay for tokio-postgres.
pub fn split_mode(url: &str) -> Result<(String, Option<Mode>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let mut mode = None;
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("sslmode", v)) => match v {
                "require" => mode = Some(Mode::Require),
                "verify-ca" => mode = Some(Mode::VerifyCa),
                "verify-full" => mode = Some(Mode::VerifyFull),
                "disable" | "allow" | "prefer" => mode = None,
                other => {
                    return Err(format!(
                        "invalid --state-url: sslmode {other:?} is not disable, allow, prefer, \
                         require, verify-ca or verify-full"
                    ))
                }
            },
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, mode))
}

/// The rustls client configuration of `mode`, trusting `ca_file`'s certificates (PEM) or, without
/// one, the system's and Mozilla's roots.
pub fn client_config(mode: Mode, ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    // As libpq: a chain checked against every public CA, whatever the name, proves nothing.
    if mode == Mode::VerifyCa && ca_file.is_none() {
        return Err(
            "sslmode=verify-ca needs --state-ca-file (the CA the database's certificate must \
             chain to); with public roots use sslmode=verify-full"
                .into(),
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS to the state database: {e}"))?;
    let roots = Arc::new(tls::roots(ca_file, "--state-ca-file")?);
    // Built for `require` too: its signature checks are the provider's, as the other modes'.
    let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
        .build()
        .map_err(|e| format!("TLS to the state database: {e}"))?;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        Mode::VerifyFull => webpki,
        Mode::VerifyCa => Arc::new(Lenient {
            webpki,
            chain: true,
        }),
        Mode::Require => Arc::new(Lenient {
            webpki,
            chain: false,
        }),
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// An error and its sources, `: `-separated (the TLS reason is a few sources down).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text = format!("{text}: {s_text}");
        }
        source = s.source();
    }
    text
}

/// Why the first connection failed, said plainly for the TLS cases.
pub(super) fn connect_error(e: &dyn std::error::Error, mode: Option<Mode>) -> String {
    let e = &chain(e);
    if mode.is_some() && e.contains("TLS") && e.contains("not support") {
        return format!(
            "cannot connect to the state database: it does not offer TLS, which --state-url's \
             sslmode asks for ({e})"
        );
    }
    if mode.is_some() && (e.contains("certificate") || e.contains("TLS handshake")) {
        return format!(
            "cannot connect to the state database: its TLS certificate is not trusted (--state-ca-file, \
             sslmode): {e}"
        );
    }
    format!("cannot connect to the state database: {e}")
}

/// `verify-ca` (`chain`: the chain must verify, the name it is for does not matter) or
/// `require` (the certificate not checked); the handshake's signatures are checked either way,
/// as `verify-full` checks them.
#[derive(Debug)]
struct Lenient {
    webpki: Arc<WebPkiServerVerifier>,
    chain: bool,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        if !self.chain {
            return Ok(ServerCertVerified::assertion());
        }
        match self
            .webpki
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(CertificateError::NotValidForName))
            | Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_takes_the_modes_that_encrypt_and_leaves_the_rest() {
        let u = "postgres://u@db:5432/agui";
        assert_eq!(split_mode(u).unwrap(), (u.to_owned(), None));
        for (q, mode) in [
            ("sslmode=require", Some(Mode::Require)),
            ("sslmode=verify-ca", Some(Mode::VerifyCa)),
            ("sslmode=verify-full", Some(Mode::VerifyFull)),
            ("sslmode=disable", None),
            ("sslmode=prefer", None),
        ] {
            let (rest, m) = split_mode(&format!("{u}?{q}&application_name=x")).unwrap();
            assert_eq!(m, mode, "{q}");
            assert_eq!(rest, format!("{u}?application_name=x"), "{q}");
        }
        assert_eq!(
            split_mode(&format!("{u}?sslmode=verify-full")).unwrap().0,
            u
        );
        assert!(split_mode(&format!("{u}?sslmode=always")).is_err());
    }

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("ca.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let e = client_config(Mode::VerifyFull, Some(&empty)).unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
        let missing = dir.path().join("missing.pem");
        assert!(client_config(Mode::VerifyCa, Some(&missing)).is_err());
        let e = client_config(Mode::VerifyCa, None).unwrap_err();
        assert!(e.contains("--state-ca-file"), "{e}");
        assert!(client_config(Mode::VerifyFull, None).is_ok());
        assert!(client_config(Mode::Require, None).is_ok());
    }
}
