//! Certificates made in the test: a CA, a server certificate for 127.0.0.1 it signs, and
//! client certificates (signed by it, or by nobody), with the TLS settings of a receiver
//! that requires a client certificate from that CA.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A certificate and its private key, PEM.
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert_pem = params.self_signed(&key).unwrap().pem();
        Self { cert_pem, issuer: Issuer::new(params, key) }
    }

    /// A certificate for the loopback server.
    pub fn server(&self) -> Identity {
        self.issue("herald-test-receiver", Some("127.0.0.1"), ExtendedKeyUsagePurpose::ServerAuth, None)
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Identity {
        self.issue(name, None, ExtendedKeyUsagePurpose::ClientAuth, None)
    }

    /// A client certificate whose validity ended `days_ago` days ago.
    pub fn expired_client(&self, name: &str, days_ago: i64) -> Identity {
        self.issue(name, None, ExtendedKeyUsagePurpose::ClientAuth, Some(days_ago))
    }

    fn issue(&self, name: &str, ip: Option<&str>, usage: ExtendedKeyUsagePurpose, ended: Option<i64>) -> Identity {
        let mut params = CertificateParams::new(ip.into_iter().map(str::to_owned).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        if let Some(days) = ended {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::days(days + 30);
            params.not_after = now - time::Duration::days(days);
        }
        let key = KeyPair::generate().unwrap();
        let cert_pem = params.signed_by(&key, &self.issuer).unwrap().pem();
        Identity { cert_pem, key_pem: key.serialize_pem() }
    }

    /// A receiver's TLS settings: `server`'s certificate, and a client certificate signed
    /// by this CA required.
    pub fn requiring_clients(&self, server: &Identity) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.cert_pem.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .unwrap();
        let chain = vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// A client certificate nobody vouches for (self-signed).
pub fn self_signed_client(name: &str) -> Identity {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    Identity { cert_pem: params.self_signed(&key).unwrap().pem(), key_pem: key.serialize_pem() }
}
