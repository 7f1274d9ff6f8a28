//! The registration guard (`ssrf::Guard::check_url`) against what delivery does with a
//! URL it accepted: `deliver::request` turns `url.as_str()` into an `http::Uri`, and the
//! connector takes the host and port from that `Uri` (port: explicit, else 443 for https,
//! else 80) and resolves the host.
//!
//! Properties, for every string the default guard accepts:
//! - its host is neither a forbidden IP literal (`ssrf::forbidden`) nor a denied name
//!   (`localhost`, `*.localhost`, the metadata name: `Guard::special_name` with no address
//!   the default guard allows), judged both on the `url` crate's `Host` and on the string the
//!   connector sees;
//! - `url.as_str()` parses as an `http::Uri` with the same scheme;
//! - the `Uri`'s host (brackets of an IPv6 literal removed) and port are the `url` crate's
//!   `host_str()` and `port_or_known_default()`.
//!
//! The raw input is not required to parse as a `Uri` itself: Herald stores the raw string
//! but always re-parses it with the `url` crate (which percent-encodes non-ASCII, adds the
//! missing `//`, punycodes names), and only `url.as_str()` ever reaches `http`.
//!
//! Found so far: the `url` crate accepts `"`, `` ` ``, `{` and `}` in host names and
//! `http::Uri` does not (fuzz/regressions/url_guard/; the guard now refuses them).
#![no_main]

use std::net::IpAddr;
use std::sync::LazyLock;

use herald::ssrf::{Guard, forbidden};
use libfuzzer_sys::fuzz_target;

static GUARD: LazyLock<Guard> = LazyLock::new(Guard::default);

/// A name the default guard stands for fixed addresses it refuses (`localhost`, the
/// metadata name).
fn name_denied(name: &str) -> bool {
    GUARD.special_name(name).is_some_and(|allowed| allowed.is_empty())
}

fn unbracketed(host: &str) -> &str {
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

fuzz_target!(|s: &str| {
    let Ok(url) = GUARD.check_url(s) else { return };
    match url.host().expect("an accepted URL has a host") {
        url::Host::Ipv4(ip) => assert!(!forbidden(IpAddr::V4(ip)), "{s:?} reaches {ip}"),
        url::Host::Ipv6(ip) => assert!(!forbidden(IpAddr::V6(ip)), "{s:?} reaches {ip}"),
        url::Host::Domain(name) => assert!(!name_denied(name), "{s:?} names {name}"),
    }

    let host = url.host_str().expect("an accepted URL has a host");
    let uri: http::Uri = match url.as_str().parse() {
        Ok(uri) => uri,
        Err(e) => panic!("guard accepted {s:?} as {:?}, but http::Uri rejects that: {e}", url.as_str()),
    };
    assert_eq!(uri.scheme_str(), Some(url.scheme()), "{s:?}");
    let uri_host = uri.host().expect("the Uri of an accepted URL has a host");
    assert_eq!(unbracketed(uri_host), unbracketed(host), "host of {s:?}");
    let uri_port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    assert_eq!(Some(uri_port), url.port_or_known_default(), "port of {s:?}");

    // The connector's view: the Uri host, an IP literal if it parses as one, else a name.
    let bare = unbracketed(uri_host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => assert!(!forbidden(ip), "{s:?} reaches {ip}"),
        Err(_) => assert!(!name_denied(bare), "{s:?} names {bare}"),
    }
});
