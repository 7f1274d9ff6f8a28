//! The HTTP client for the operator's own destinations (the alerts webhook, the trace
//! collector, the servers of an import): the public roots, and no destination guard, since the operator configured
//! the URL, not a tenant.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

pub type OperatorClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

pub fn operator_client() -> OperatorClient {
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
        .with_no_client_auth();
    let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http().enable_http1().build();
    Client::builder(TokioExecutor::new()).build(https)
}
