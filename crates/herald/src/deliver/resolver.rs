//! Name resolution behind the destination guard. Every A and AAAA answer is judged, and
//! every name on the way (CNAME targets included); one forbidden answer refuses the whole
//! name. The connector then connects only to the addresses returned here, so a name cannot
//! be re-pointed at a forbidden address between the check and the connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{LookupIpStrategy, NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::{ResolveError as DnsError, TokioResolver};

use crate::ssrf::Guard;

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

/// The resolver Herald's deliveries use: the system's (`/etc/resolv.conf`) or the
/// configured name servers, with its own time budget.
#[derive(Clone)]
pub struct Resolver {
    dns: Arc<TokioResolver>,
    guard: Arc<Guard>,
    budget: Duration,
}

impl Resolver {
    /// `servers` empty: the system configuration.
    pub fn new(guard: Arc<Guard>, servers: &[SocketAddr], budget: Duration) -> Self {
        let provider = TokioConnectionProvider::default();
        let mut builder = if servers.is_empty() {
            TokioResolver::builder_tokio().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the system resolver configuration; using defaults");
                TokioResolver::builder_with_config(ResolverConfig::default(), provider.clone())
            })
        } else {
            let mut group = NameServerConfigGroup::new();
            for server in servers {
                group.merge(NameServerConfigGroup::from_ips_clear(&[server.ip()], server.port(), true));
            }
            TokioResolver::builder_with_config(ResolverConfig::from_parts(None, vec![], group), provider)
        };
        let options: &mut ResolverOpts = builder.options_mut();
        options.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        options.timeout = budget;
        options.attempts = 1;
        Self { dns: Arc::new(builder.build()), guard, budget }
    }

    /// The allowed addresses of `host` (a name or an IP literal), or why there are none.
    pub async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return self.judge(host, vec![ip]);
        }
        // `localhost` and the metadata name stand for fixed addresses (never asked of
        // DNS): those the operator allowed, or none.
        match self.guard.special_name(bare) {
            Some(addrs) if addrs.is_empty() => return Err(ResolveError::Blocked(bare.to_owned())),
            Some(addrs) => return Ok(addrs),
            None => {}
        }
        let lookup = match tokio::time::timeout(self.budget, self.dns.lookup_ip(bare)).await {
            Err(_) => return Err(ResolveError::Temporary(bare.to_owned(), "the DNS budget ran out".into())),
            Ok(Err(e)) => return Err(classify(bare, &e)),
            Ok(Ok(lookup)) => lookup,
        };
        for record in lookup.as_lookup().records() {
            if let RData::CNAME(target) = record.data()
                && self.guard.special_name(&target.0.to_ascii()).is_some()
            {
                return Err(ResolveError::Blocked(format!("{bare} (alias of {})", target.0)));
            }
        }
        self.judge(bare, lookup.iter().collect())
    }

    fn judge(&self, host: &str, addrs: Vec<IpAddr>) -> Result<Vec<IpAddr>, ResolveError> {
        if addrs.is_empty() {
            return Err(ResolveError::NotFound(host.to_owned()));
        }
        // One forbidden answer refuses the whole name: a name that mixes public and private
        // addresses is an attack, not a configuration.
        if let Some(bad) = addrs.iter().find(|ip| !self.guard.ip_allowed(**ip)) {
            return Err(ResolveError::Blocked(format!("{host} ({bad})")));
        }
        Ok(addrs)
    }
}

fn classify(host: &str, e: &DnsError) -> ResolveError {
    if e.is_nx_domain() || e.is_no_records_found() {
        ResolveError::NotFound(host.to_owned())
    } else {
        ResolveError::Temporary(host.to_owned(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(guard: Guard) -> Resolver {
        Resolver::new(Arc::new(guard), &[], Duration::from_secs(2))
    }

    #[tokio::test]
    async fn loopback_names_are_refused_before_resolution() {
        let resolver = resolver(Guard::default());
        assert!(matches!(resolver.resolve("localhost").await, Err(ResolveError::Blocked(_))));
        assert!(matches!(resolver.resolve("api.localhost.").await, Err(ResolveError::Blocked(_))));
    }

    #[tokio::test]
    async fn loopback_names_reach_loopback_only_when_the_operator_allowed_it() {
        let open = resolver(Guard::new(vec!["127.0.0.0/8".parse().unwrap()]));
        assert_eq!(open.resolve("localhost").await.unwrap(), vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(open.resolve("hooks.localhost").await.unwrap(), vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert!(matches!(open.resolve("metadata.google.internal").await, Err(ResolveError::Blocked(_))));
    }

    #[tokio::test]
    async fn literals_take_the_same_path_and_resolve_only_when_allowed() {
        assert!(matches!(resolver(Guard::default()).resolve("127.0.0.1").await, Err(ResolveError::Blocked(_))));
        assert!(matches!(resolver(Guard::default()).resolve("[::1]").await, Err(ResolveError::Blocked(_))));
        let open = resolver(Guard::new(vec!["127.0.0.0/8".parse().unwrap()]));
        assert_eq!(open.resolve("127.0.0.1").await.unwrap(), vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    }
}
