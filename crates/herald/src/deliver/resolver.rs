//! Name resolution behind the destination guard. The HTTP connector connects only to the
//! addresses returned here, and every one of them has been judged, so a name cannot be
//! re-pointed at a forbidden address between the check and the connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

use crate::ssrf::{Guard, name_denied};

/// Why a destination could not be resolved to allowed addresses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("destination {0} is not allowed (private, loopback or special-purpose)")]
    Blocked(String),
    #[error("name {0} does not exist")]
    NotFound(String),
    #[error("resolving {0} failed: {1}")]
    Temporary(String, String),
}

#[derive(Clone)]
pub struct GuardedResolver {
    guard: Arc<Guard>,
}

impl GuardedResolver {
    pub fn new(guard: Arc<Guard>) -> Self {
        Self { guard }
    }
}

impl tower::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ResolveError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ResolveError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let guard = self.guard.clone();
        Box::pin(async move { resolve(&guard, name.as_str()).await })
    }
}

async fn resolve(guard: &Guard, host: &str) -> Result<std::vec::IntoIter<SocketAddr>, ResolveError> {
    if name_denied(host) {
        return Err(ResolveError::Blocked(host.to_owned()));
    }
    let addrs: Vec<SocketAddr> =
        tokio::net::lookup_host((host, 0)).await.map_err(|e| classify_lookup_error(host, &e))?.collect();
    if addrs.is_empty() {
        return Err(ResolveError::NotFound(host.to_owned()));
    }
    // One forbidden answer refuses the whole name: a name that mixes public and private
    // addresses is an attack, not a configuration.
    if let Some(bad) = addrs.iter().find(|a| !guard.ip_allowed(a.ip())) {
        return Err(ResolveError::Blocked(format!("{host} ({})", bad.ip())));
    }
    Ok(addrs.into_iter())
}

/// The system resolver only reports text; "does not exist" answers are permanent, anything
/// else may pass.
fn classify_lookup_error(host: &str, e: &std::io::Error) -> ResolveError {
    let text = e.to_string();
    let not_found = ["Name or service not known", "No address associated", "nodename nor servname", "not known"]
        .iter()
        .any(|needle| text.contains(needle));
    if not_found { ResolveError::NotFound(host.to_owned()) } else { ResolveError::Temporary(host.to_owned(), text) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_names_are_refused_before_resolution() {
        let guard = Guard::default();
        assert!(matches!(resolve(&guard, "localhost").await, Err(ResolveError::Blocked(_))));
        assert!(matches!(resolve(&guard, "api.localhost.").await, Err(ResolveError::Blocked(_))));
    }

    #[tokio::test]
    async fn literal_loopback_resolves_only_when_allowed() {
        assert!(matches!(resolve(&Guard::default(), "127.0.0.1").await, Err(ResolveError::Blocked(_))));
        let open = Guard::new(vec!["127.0.0.0/8".parse().unwrap()]);
        let addrs: Vec<_> = resolve(&open, "127.0.0.1").await.unwrap().collect();
        assert_eq!(addrs[0].ip().to_string(), "127.0.0.1");
    }
}
