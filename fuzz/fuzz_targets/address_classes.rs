//! Address classes of the destination guard.
//!
//! Properties:
//! - every IPv4 address is judged by `ssrf::forbidden` exactly like its IPv4-mapped form
//!   (`::ffff:a.b.c.d`) and its NAT64 form (`64:ff9b::a.b.c.d`), which reach the same host;
//! - `forbidden` never panics on any IPv6 address.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use herald::ssrf::forbidden;
use libfuzzer_sys::fuzz_target;

/// The NAT64 well-known prefix 64:ff9b::/96.
const NAT64: u128 = 0x0064_ff9b << 96;

fuzz_target!(|input: (u32, u128)| {
    let (v4_bits, v6_bits) = input;
    let v4 = Ipv4Addr::from(v4_bits);
    let expected = forbidden(IpAddr::V4(v4));
    assert_eq!(forbidden(IpAddr::V6(v4.to_ipv6_mapped())), expected, "{v4} mapped");
    let nat64 = Ipv6Addr::from(NAT64 | u128::from(v4_bits));
    assert_eq!(forbidden(IpAddr::V6(nat64)), expected, "{v4} as {nat64}");

    let _ = forbidden(IpAddr::V6(Ipv6Addr::from(v6_bits)));
});
