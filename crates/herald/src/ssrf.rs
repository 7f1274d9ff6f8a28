//! The destination guard: which URLs may be registered and which addresses Herald may
//! connect to. Judgement is on parsed values (the `url` crate's host, `IpAddr`s from the
//! resolver), never on raw strings, and the connection later goes only to the addresses
//! judged here (see `deliver::connector`), so DNS rebinding has no window.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;
use url::{Host, Url};

/// Longest endpoint URL accepted.
pub const MAX_URL_LEN: usize = 2048;

/// The addresses of `localhost` and `*.localhost` (RFC 6761): never asked of DNS.
const LOOPBACK: [IpAddr; 2] = [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];
/// The cloud metadata service's name and address.
const METADATA_NAME: &str = "metadata.google.internal";
const METADATA: [IpAddr; 1] = [IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))];

/// The judge of destinations: special-purpose ranges are closed, the networks the operator
/// opened up (`HERALD_ALLOWED_NETWORKS`) are the only way back in, and Herald itself (its
/// listening address and public host name) is never a destination.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allowed: Vec<IpNet>,
    own_addr: Option<SocketAddr>,
    own_host: Option<String>,
    /// Any port may be registered (`delivery.any_port`); otherwise 80, 443 and 1024 up.
    any_port: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("URL is longer than {MAX_URL_LEN} bytes")]
    TooLong,
    #[error("URL contains whitespace, a control character or a backslash")]
    ForbiddenCharacter,
    #[error("URL is not valid: {0}")]
    Unparsable(String),
    #[error("only http and https URLs are allowed")]
    Scheme,
    #[error("URLs must not carry a user name or password")]
    Userinfo,
    #[error("URL has no host")]
    NoHost,
    #[error("port {0} is not allowed (use 80, 443 or a port of 1024 or above; delivery.any_port lifts this)")]
    Port(u16),
    #[error("destination {0} is not allowed (private, loopback or special-purpose)")]
    Blocked(String),
    #[error("destination {0} is Herald itself")]
    Herald(String),
}

impl Guard {
    pub fn new(allowed: Vec<IpNet>) -> Self {
        Self { allowed, own_addr: None, own_host: None, any_port: false }
    }

    /// Accepts URLs with any port (Svix does).
    pub fn with_any_port(mut self, any_port: bool) -> Self {
        self.any_port = any_port;
        self
    }

    /// Marks Herald's own listening address and public host name as forbidden.
    pub fn with_own(mut self, addr: SocketAddr, public_host: Option<String>) -> Self {
        self.own_addr = Some(addr);
        self.own_host = public_host.map(|h| h.trim_end_matches('.').to_ascii_lowercase());
        self
    }

    /// Whether `addr` is Herald's own listener. A listener on the unspecified address is
    /// reachable through every local address: then any address that only the allow-list
    /// opens, on the same port, counts as Herald.
    pub fn is_own(&self, addr: SocketAddr) -> bool {
        let Some(own) = self.own_addr else { return false };
        if addr.port() != own.port() {
            return false;
        }
        let ip = canonical(addr.ip());
        ip == canonical(own.ip()) || (own.ip().is_unspecified() && forbidden(ip))
    }

    /// Whether Herald may connect to `ip`.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.allowed.iter().any(|net| net.contains(&ip)) || !forbidden(ip)
    }

    /// Parses and judges an endpoint URL at registration. Names are not resolved here (they
    /// are judged again, resolved, at every connection), but IP literals and denied names
    /// are refused at once.
    pub fn check_url(&self, raw: &str) -> Result<Url, UrlProblem> {
        if raw.len() > MAX_URL_LEN {
            return Err(UrlProblem::TooLong);
        }
        if raw.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\\') {
            return Err(UrlProblem::ForbiddenCharacter);
        }
        let url = Url::parse(raw).map_err(|e| UrlProblem::Unparsable(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UrlProblem::Scheme);
        }
        // The HTTP stack parses the URL again (`http::Uri`); it must see the same host and
        // port, or the guard would have judged a different destination than the one dialed.
        let uri: http::Uri =
            url.as_str().parse().map_err(|e: http::uri::InvalidUri| UrlProblem::Unparsable(e.to_string()))?;
        let same_host = uri.host().map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            == url.host_str().map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        if !same_host || uri.port_u16() != url.port() {
            return Err(UrlProblem::Unparsable("the URL's host is read differently by HTTP clients".into()));
        }
        self.check_authority(&url)?;
        Ok(url)
    }

    /// Judges a parsed URL's user info, host and port by the same rules whatever its
    /// scheme: no credentials in it, the operator's port rule, the host's address (literals
    /// and special names; other names at every connection), and never Herald itself. An
    /// event destination's broker address is judged here too.
    pub fn check_authority(&self, url: &Url) -> Result<(), UrlProblem> {
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UrlProblem::Userinfo);
        }
        // Outside http(s) an address is an opaque host to the URL parser: read it as the
        // address it is, or a literal would pass as a name.
        let host = match url.host().ok_or(UrlProblem::NoHost)? {
            Host::Domain(name) => match name.parse::<IpAddr>() {
                Ok(IpAddr::V4(ip)) => Host::Ipv4(ip),
                Ok(IpAddr::V6(ip)) => Host::Ipv6(ip),
                Err(_) => Host::Domain(name),
            },
            other => other,
        };
        // The port rule is the operator's; a destination the operator opened up (an address,
        // or `localhost`, in an allowed network) takes any port, as in Svix.
        if let Some(port) = url.port()
            && port < 1024
            && port != 80
            && port != 443
            && !self.any_port
            && !self.opened_up(&host)
        {
            return Err(UrlProblem::Port(port));
        }
        self.check_host(host.clone())?;
        let own_name = matches!((&host, &self.own_host), (Host::Domain(name), Some(own))
            if name.trim_end_matches('.').eq_ignore_ascii_case(own));
        let own_addr = match (host, url.port_or_known_default()) {
            (Host::Ipv4(ip), Some(port)) => self.is_own(SocketAddr::new(IpAddr::V4(ip), port)),
            (Host::Ipv6(ip), Some(port)) => self.is_own(SocketAddr::new(IpAddr::V6(ip), port)),
            _ => false,
        };
        if own_name || own_addr {
            return Err(UrlProblem::Herald(url.host_str().unwrap_or_default().to_owned()));
        }
        Ok(())
    }

    /// Judges a parsed host: IP literals by address, `localhost` and the metadata name by
    /// their fixed addresses; other names only when they are resolved, at every connection.
    pub fn check_host(&self, host: Host<&str>) -> Result<(), UrlProblem> {
        match host {
            Host::Ipv4(ip) => self.check_ip(IpAddr::V4(ip)),
            Host::Ipv6(ip) => self.check_ip(IpAddr::V6(ip)),
            Host::Domain(name) => match self.special_name(name) {
                Some(addrs) if addrs.is_empty() => Err(UrlProblem::Blocked(name.to_owned())),
                _ => Ok(()),
            },
        }
    }

    /// For `localhost`, `*.localhost` and the cloud metadata name: the addresses they stand
    /// for that Herald may reach (none unless the operator allowed them); `None` for any
    /// other name, which only DNS answers.
    pub fn special_name(&self, name: &str) -> Option<Vec<IpAddr>> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let addrs: &[IpAddr] = if name == "localhost" || name.ends_with(".localhost") {
            &LOOPBACK
        } else if name == METADATA_NAME {
            &METADATA
        } else {
            return None;
        };
        Some(addrs.iter().copied().filter(|ip| self.ip_allowed(*ip)).collect())
    }

    /// Whether `host` is a destination only the operator's allowed networks make reachable.
    pub fn opened_up(&self, host: &Host<&str>) -> bool {
        let in_allowed = |ip: IpAddr| self.allowed.iter().any(|net| net.contains(&canonical(ip)));
        match host {
            Host::Ipv4(ip) => in_allowed(IpAddr::V4(*ip)),
            Host::Ipv6(ip) => in_allowed(IpAddr::V6(*ip)),
            Host::Domain(name) => self.special_name(name).is_some_and(|addrs| !addrs.is_empty()),
        }
    }

    pub fn check_ip(&self, ip: IpAddr) -> Result<(), UrlProblem> {
        if self.ip_allowed(ip) { Ok(()) } else { Err(UrlProblem::Blocked(ip.to_string())) }
    }
}

/// Unwraps IPv4-mapped IPv6 (`::ffff:a.b.c.d`) so it is judged as the IPv4 it reaches.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// Whether an address is in a special-purpose range no webhook may reach.
pub fn forbidden(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    a == 0 // "this network", 0.0.0.0/8
        || a == 10 // private
        || (a == 100 && (64..128).contains(&b)) // CGNAT 100.64.0.0/10
        || a == 127 // loopback
        || (a == 169 && b == 254) // link-local, cloud metadata
        || (a == 172 && (16..32).contains(&b)) // private
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // TEST-NET-1
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 192 && b == 168) // private
        || (a == 198 && (18..20).contains(&b)) // benchmarking 198.18.0.0/15
        || (a == 198 && b == 51 && c == 100) // TEST-NET-2
        || (a == 203 && b == 0 && c == 113) // TEST-NET-3
        || a >= 224 // multicast 224/4, reserved 240/4, broadcast
}

fn forbidden_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    // NAT64 well-known prefix 64:ff9b::/96: judge the IPv4 it translates to.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        return forbidden_v4(Ipv4Addr::new(a, b, c, d));
    }
    // Only global unicast (2000::/3) can be public. Everything else — unspecified,
    // loopback, IPv4-compatible and -translated forms, local-use NAT64, discard-only,
    // ULA (fc00::/7, including fd00:ec2::254), link-local, site-local, multicast — is refused.
    if s[0] & 0xe000 != 0x2000 {
        return true;
    }
    let ietf_assignments = s[0] == 0x2001 && s[1] < 0x0200; // 2001::/23: Teredo, benchmarking, ORCHID
    let documentation = (s[0] == 0x2001 && s[1] == 0x0db8) || (s[0] & 0xfff0) == 0x3ff0; // and 3fff::/20
    let six_to_four = s[0] == 0x2002;
    ietf_assignments || documentation || six_to_four
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn special_purpose_ipv4_ranges_are_forbidden() {
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.0.0.2",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(forbidden(ip(s)), "{s} must be forbidden");
        }
    }

    #[test]
    fn public_ipv4_addresses_are_allowed() {
        for s in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.0.1",
            "172.32.0.1",
            "198.20.0.1",
            "223.255.255.255",
        ] {
            assert!(!forbidden(ip(s)), "{s} must be allowed");
        }
    }

    #[test]
    fn special_purpose_ipv6_ranges_and_transition_forms_are_forbidden() {
        for s in [
            "::",
            "::1",
            "::127.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:0:7f00:1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:2::1",
            "2001:db8::1",
            "2002:7f00:1::",
            "3fff::1",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(forbidden(ip(s)), "{s} must be forbidden");
        }
    }

    #[test]
    fn public_ipv6_and_its_embeddings_of_public_ipv4_are_allowed() {
        for s in ["2606:4700:4700::1111", "2a00:1450:4001::1", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            assert!(!forbidden(ip(s)), "{s} must be allowed");
        }
    }

    #[test]
    fn forbidden_is_the_same_for_ipv4_and_its_mapped_and_nat64_forms() {
        for v4 in ["127.0.0.1", "8.8.8.8", "10.1.2.3", "169.254.169.254", "1.2.3.4", "224.1.1.1"] {
            let v4: Ipv4Addr = v4.parse().unwrap();
            let [a, b, c, d] = v4.octets();
            let nat64 = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            let expected = forbidden(IpAddr::V4(v4));
            assert_eq!(forbidden(IpAddr::V6(v4.to_ipv6_mapped())), expected, "{v4} mapped");
            assert_eq!(forbidden(IpAddr::V6(nat64)), expected, "{v4} nat64");
        }
    }

    #[test]
    fn registration_takes_localhost_and_any_port_inside_allowed_networks_only() {
        let closed = Guard::default();
        assert_eq!(closed.check_url("http://localhost:8080/"), Err(UrlProblem::Blocked("localhost".into())));
        assert_eq!(closed.check_url("http://hooks.example.com:22/"), Err(UrlProblem::Port(22)));
        assert!(closed.clone().with_any_port(true).check_url("http://hooks.example.com:22/").is_ok());
        let loopback = Guard::new(vec!["127.0.0.0/8".parse().unwrap()]);
        for url in ["http://localhost:8080/", "http://localhost:22/", "http://127.0.0.1:25/", "http://app.localhost/"] {
            assert!(loopback.check_url(url).is_ok(), "{url}");
        }
        assert_eq!(
            loopback.check_url("http://hooks.example.com:22/"),
            Err(UrlProblem::Port(22)),
            "public names keep the rule"
        );
        assert!(loopback.check_url("http://metadata.google.internal/").is_err());
    }

    #[test]
    fn allowed_networks_open_a_forbidden_range() {
        let guard = Guard::new(vec!["127.0.0.1/32".parse().unwrap()]);
        assert!(guard.ip_allowed(ip("127.0.0.1")));
        assert!(guard.ip_allowed(ip("::ffff:127.0.0.1")));
        assert!(!guard.ip_allowed(ip("127.0.0.2")));
        assert!(!guard.ip_allowed(ip("10.0.0.1")));
    }

    #[test]
    fn registration_refuses_hostile_urls() {
        let guard = Guard::default();
        let cases = [
            ("http://127.0.0.1:9999/hook", "blocked"),
            ("http://2130706433:9999/", "blocked"),
            ("http://127.1:9999/", "blocked"),
            ("http://0:9999/", "blocked"),
            ("http://[::ffff:127.0.0.1]:9999/", "blocked"),
            ("http://[::127.0.0.1]:9999/", "blocked"),
            ("http://localhost:9999/", "blocked"),
            ("http://LOCALHOST.:9999/", "blocked"),
            ("http://api.localhost:9999/", "blocked"),
            ("http://metadata.google.internal/computeMetadata/v1/", "blocked"),
            ("file:///etc/passwd", "scheme"),
            ("gopher://127.0.0.1:6379/_FLUSHALL", "scheme"),
            ("https://hooks.example.com@127.0.0.1:9999/", "userinfo"),
            ("http://hooks.example.com\\@127.0.0.1:9999/", "char"),
            ("http://hooks.example.com/\r\nX-Injected: 1", "char"),
            ("http://hooks.example.com:65536/", "parse"),
            ("http://hooks.example.com:22/", "port"),
            ("http://[fe80::1%25eth0]/", "parse"),
        ];
        for (url, why) in cases {
            let err = guard.check_url(url).expect_err(url);
            let ok = match why {
                "blocked" => matches!(err, UrlProblem::Blocked(_)),
                "scheme" => err == UrlProblem::Scheme,
                "userinfo" => err == UrlProblem::Userinfo,
                "char" => err == UrlProblem::ForbiddenCharacter,
                "parse" => matches!(err, UrlProblem::Unparsable(_)),
                "port" => err == UrlProblem::Port(22),
                _ => unreachable!(),
            };
            assert!(ok, "{url}: got {err:?}, wanted {why}");
        }
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(guard.check_url(&long), Err(UrlProblem::TooLong));
    }

    #[test]
    fn hosts_the_http_stack_would_read_differently_are_refused() {
        // Found by the url_guard fuzz target: the `url` crate accepts a backtick in a host
        // name, `http::Uri` does not.
        for url in ["http:`", "http://a`b.example/", "http://exa`mple.com:8080/x"] {
            assert!(matches!(Guard::default().check_url(url), Err(UrlProblem::Unparsable(_))), "{url}");
        }
    }

    #[test]
    fn herald_itself_is_never_a_destination() {
        let open = vec!["127.0.0.0/8".parse().unwrap()];
        let guard = Guard::new(open).with_own("127.0.0.1:8071".parse().unwrap(), Some("Hooks.Example.com".into()));
        assert_eq!(guard.check_url("http://127.0.0.1:8071/api"), Err(UrlProblem::Herald("127.0.0.1".into())));
        assert!(matches!(guard.check_url("https://hooks.example.com./api/v1/events"), Err(UrlProblem::Herald(_))));
        assert!(guard.check_url("http://127.0.0.1:8072/").is_ok());
        assert!(guard.is_own("[::ffff:127.0.0.1]:8071".parse().unwrap()));
        let anywhere = Guard::new(vec!["10.0.0.0/8".parse().unwrap()]).with_own("0.0.0.0:8071".parse().unwrap(), None);
        assert!(anywhere.is_own("10.1.2.3:8071".parse().unwrap()), "a private address of this host");
        assert!(!anywhere.is_own("93.184.216.34:8071".parse().unwrap()));
    }

    #[test]
    fn registration_accepts_ordinary_urls() {
        let guard = Guard::default();
        for url in ["https://hooks.example.com/webhook", "http://example.com:8080/x?y=1", "https://[2606:4700::1]/"] {
            assert!(guard.check_url(url).is_ok(), "{url}");
        }
    }
}
