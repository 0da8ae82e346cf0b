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
        let key = KeyPair::generate().expect("server key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "iac-code-agui test server");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("server certificate");
        (cert.pem(), key.serialize_pem())
    }
}

impl Default for Ca {
    fn default() -> Ca {
        Ca::new()
    }
}
