//! Certificates made by a test: a CA of its own and server certificates it signs (rcgen, the ring
//! provider), as PEM.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// A certificate authority for one test.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub fn new() -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "iac-code-agui test CA");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    /// The CA's certificate (PEM), what a client is told to trust.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `names` (host names or IP addresses) and its key, PEM.
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let (cert, key, _) = self.issue_with_spki(names);
        (cert, key)
    }

    /// [`Ca::issue`], and the base64 SHA-256 of the certificate's public key (what Chromium's
    /// `--ignore-certificate-errors-spki-list` takes to trust exactly this certificate).
    pub fn issue_with_spki(&self, names: &[&str]) -> (String, String, String) {
        use base64::Engine as _;
        use sha2::Digest as _;
        let key = KeyPair::generate().expect("server key");
        let spki = base64::engine::general_purpose::STANDARD
            .encode(sha2::Sha256::digest(key.public_key_der()));
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "iac-code-agui test server");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("server certificate");
        (cert.pem(), key.serialize_pem(), spki)
    }
}

impl Default for Ca {
    fn default() -> Ca {
        Ca::new()
    }
}
