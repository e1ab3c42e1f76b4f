//! A certificate authority and a server certificate it signed, made fresh for one test,
//! and a rustls server configuration that presents the certificate: what the TLS servers
//! of the host's, the agent's and the plugins' tests need. The CA is trusted only where a
//! test hands [`TestPki::ca_pem`] or [`TestPki::ca`] to the client under test.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A test CA and one server certificate for the names it was made with.
#[derive(Debug)]
pub struct TestPki {
    /// The CA certificate, DER.
    pub ca: CertificateDer<'static>,
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server certificate, DER.
    pub cert: CertificateDer<'static>,
    /// The server certificate's private key, PKCS#8 DER.
    pub key: Vec<u8>,
}

impl TestPki {
    /// A CA named `common_name` and a server certificate for `names` (DNS names or IP
    /// addresses) it signed.
    ///
    /// # Panics
    /// When rcgen cannot make a key or a certificate (never with valid names).
    #[must_use]
    pub fn new(common_name: &str, names: &[&str]) -> TestPki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        TestPki {
            ca: ca.der().clone(),
            ca_pem: ca.pem(),
            cert: cert.der().clone(),
            key: key.serialize_der(),
        }
    }

    /// A rustls server configuration (ring) presenting the server certificate.
    ///
    /// # Panics
    /// When rustls refuses the certificate or key made by [`TestPki::new`].
    #[must_use]
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![self.cert.clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone())),
        )
        .unwrap();
        Arc::new(config)
    }
}
