//! Mutual TLS (Herald extension `tls`): the client certificate (with its chain) an endpoint
//! presents when its receiver asks for one, its private key, and optionally the CAs to trust
//! for that endpoint instead of the public roots. All PEM; checked when set (the key must
//! match the certificate, which must not have expired); reads show subjects and expiry.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;

use crate::clock::{now_ms, to_rfc3339};

/// Largest PEM text accepted per field.
const MAX_PEM: usize = 64 * 1024;

/// The client side of mutual TLS, as given (and as sealed).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientTls {
    /// The client certificate, then any intermediates.
    pub client_certificate_pem: String,
    /// PKCS#8, PKCS#1 (RSA) or SEC1 (EC), unencrypted.
    pub client_key_pem: String,
    /// CAs that sign the receiver's certificate; when set, the public roots are not trusted
    /// for this endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

/// What reads show of an endpoint's `tls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSummary {
    pub client_certificate: Option<CertificateSummary>,
    /// The CAs trusted for the endpoint; empty when it trusts the public roots.
    pub ca: Vec<CertificateSummary>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSummary {
    pub subject: String,
    pub issuer: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// An endpoint's TLS client settings, ready for connections.
pub struct EndpointTls {
    /// Identifies the settings (one connection pool each), without revealing the key.
    pub fingerprint: [u8; 32],
    pub config: ClientConfig,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls(<redacted>)")
    }
}

impl std::fmt::Debug for EndpointTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndpointTls(<redacted>)")
    }
}

/// The TLS settings of every delivery connection: Herald's crypto provider and safe
/// protocol versions, the given roots (the public ones by default) and, for mutual TLS, a
/// client identity.
pub fn client_config(
    roots: Option<RootCertStore>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, rustls::Error> {
    let roots = roots.unwrap_or_else(|| RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() });
    let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((chain, key)) => builder.with_client_auth_cert(chain, key),
    }
}

fn certificates(field: &'static str, pem: &str) -> Result<Vec<CertificateDer<'static>>, (&'static str, String)> {
    if pem.len() > MAX_PEM {
        return Err((field, format!("is longer than {MAX_PEM} bytes")));
    }
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| (field, format!("is not PEM: {e}")))?;
    if certs.is_empty() {
        return Err((field, "holds no CERTIFICATE block".into()));
    }
    for der in &certs {
        x509_parser::parse_x509_certificate(der)
            .map_err(|e| (field, format!("holds an unreadable certificate: {e}")))?;
    }
    Ok(certs)
}

fn summarize(der: &CertificateDer<'_>) -> Option<CertificateSummary> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(CertificateSummary {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        expires_at: to_rfc3339(cert.validity().not_after.timestamp().saturating_mul(1000)),
    })
}

impl ClientTls {
    /// Settings ready for connections, or the field at fault and why.
    pub fn prepare(&self) -> Result<EndpointTls, (&'static str, String)> {
        let chain = certificates("tls.clientCertificatePem", &self.client_certificate_pem)?;
        let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).expect("checked by certificates()");
        if leaf.validity().not_after.timestamp().saturating_mul(1000) < now_ms() {
            let expired = to_rfc3339(leaf.validity().not_after.timestamp().saturating_mul(1000));
            return Err(("tls.clientCertificatePem", format!("expired at {expired}")));
        }
        if self.client_key_pem.len() > MAX_PEM {
            return Err(("tls.clientKeyPem", format!("is longer than {MAX_PEM} bytes")));
        }
        let key = PrivateKeyDer::from_pem_slice(self.client_key_pem.as_bytes())
            .map_err(|_| ("tls.clientKeyPem", "holds no unencrypted PKCS#8, PKCS#1 or SEC1 private key".to_owned()))?;
        let roots = match &self.ca_pem {
            None => None,
            Some(pem) => {
                let mut roots = RootCertStore::empty();
                for der in certificates("tls.caPem", pem)? {
                    roots
                        .add(der)
                        .map_err(|e| ("tls.caPem", format!("holds a certificate that cannot be a CA: {e}")))?;
                }
                Some(roots)
            }
        };
        let config = client_config(roots, Some((chain, key)))
            .map_err(|e| ("tls.clientKeyPem", format!("does not go with the certificate: {e}")))?;
        let json = serde_json::to_vec(self).expect("TLS settings serialize");
        Ok(EndpointTls { fingerprint: Sha256::digest(&json).into(), config })
    }

    /// Why these settings cannot be used, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        self.prepare().err().into_iter().collect()
    }

    pub fn summary(&self) -> TlsSummary {
        let first = CertificateDer::pem_slice_iter(self.client_certificate_pem.as_bytes()).next();
        let ca = self.ca_pem.as_deref().map(|pem| CertificateDer::pem_slice_iter(pem.as_bytes()));
        TlsSummary {
            client_certificate: first.and_then(Result::ok).as_ref().and_then(summarize),
            ca: ca.into_iter().flatten().filter_map(Result::ok).filter_map(|der| summarize(&der)).collect(),
        }
    }
}
