//! TLS with rustls and the ring provider (no OpenSSL, no C build): a listener's certificate,
//! read again without a restart, and the trust roots of the gateway's own TLS clients.
//!
//! A listener with `--tls-cert`/`--tls-key` (the admin listener: `--metrics-tls-cert`/
//! `--metrics-tls-key`) serves HTTP/1.1 over TLS 1.2/1.3. Its pair is read at start (a pair that
//! cannot be used stops the start), then again on SIGHUP and when either file changes (checked
//! every [`WATCH_EVERY`]): the next handshake gets the new certificate, connections already open
//! keep theirs. A pair that cannot be read keeps the one served (logged).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;

/// How often the files are looked at.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);
/// A TLS handshake must be done within this of the connection (as a request head must).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and key pair, served and read again when it changes.
#[derive(Debug)]
pub struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last read.
    stamp: Mutex<Option<(SystemTime, SystemTime)>>,
}

impl Reloading {
    /// Reads the pair; an error says which file and why.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Reloading>, String> {
        let current = read_pair(cert, key)?;
        Ok(Arc::new(Reloading {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(current)),
            stamp: Mutex::new(stamps(cert, key)),
        }))
    }

    /// Reads the pair again when `force`d or when a file changed since the last read. Returns
    /// whether a new pair is served.
    pub fn reload(&self, force: bool) -> bool {
        let now = stamps(&self.cert, &self.key);
        {
            let mut last = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
            if !force && *last == now {
                return false;
            }
            *last = now;
        }
        match read_pair(&self.cert, &self.key) {
            Ok(pair) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(pair);
                tracing::info!(cert = %self.cert.display(), "TLS certificate read again");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the TLS certificate could not be read again; the one served stays");
                false
            }
        }
    }

    /// The server configuration that serves this pair (HTTP/1.1 only).
    pub fn acceptor(self: &Arc<Self>) -> Result<tokio_rustls::TlsAcceptor, String> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
    }

    /// Reads the pair again on SIGHUP and when a file changes, until the task is aborted.
    pub fn spawn_watch(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hup = signal(SignalKind::hangup()).ok();
            loop {
                let forced = tokio::select! {
                    _ = async { match hup.as_mut() {
                        Some(h) => { h.recv().await; }
                        None => std::future::pending::<()>().await,
                    } } => true,
                    _ = tokio::time::sleep(WATCH_EVERY) => false,
                };
                let me = me.clone();
                let _ = tokio::task::spawn_blocking(move || me.reload(forced)).await;
            }
        })
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        )
    }
}

fn stamps(cert: &Path, key: &Path) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("TLS certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "TLS certificate {}: no certificate in it",
            cert.display()
        ));
    }
    let der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("TLS key {}: {e}", key.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&der)
        .map_err(|e| format!("TLS key {}: {e}", key.display()))?;
    let pair = CertifiedKey::new(certs, signing);
    pair.keys_match().map_err(|e| {
        format!(
            "TLS key {} does not match {}: {e}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(pair)
}

/// Trust roots: the certificates of `ca_file` (PEM), else the system's and Mozilla's.
pub fn roots(ca_file: Option<&Path>, what: &str) -> Result<rustls::RootCertStore, String> {
    let mut store = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| format!("{what} {}: {e}", path.display());
            for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
                store.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
            if store.is_empty() {
                return Err(bad(&"no certificate in it"));
            }
        }
        None => {
            store.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = store.add(cert);
            }
        }
    }
    Ok(store)
}

/// A TLS client trusting `ca_file` (else the usual roots), with the ring provider.
pub fn client(ca_file: Option<&Path>, what: &str) -> Result<Arc<rustls::ClientConfig>, String> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots(ca_file, what)?)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests;
