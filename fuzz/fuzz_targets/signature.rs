//! Standard Webhooks signatures, as a receiver would check them.
//!
//! Input layout (so seeds read like a request):
//!
//! ```text
//! <secret>\n<whpk_ public key>\n<now, unix seconds>\n<Name: value>\n...\n\n<body bytes>
//! ```
//!
//! Properties:
//! - parsing secrets (`SigningKey::decode`, `SigningKey::parse_endpoint_secret`,
//!   `AsymmetricKey::parse`) and verifying arbitrary header sets (`verify`, `verify_v1a`)
//!   never panics;
//! - a secret the endpoint parser accepts survives its canonical `whsec_` form;
//! - a `signature_header` made for any id, timestamp and body verifies with each key it
//!   carries (one key, or a rotation of two), at both ends of the ±`TOLERANCE_SECS` window.
#![no_main]

use herald::signing::{AsymmetricKey, SignedHeaders, SigningKey, TOLERANCE_SECS, signature_header, verify, verify_v1a};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let Ok(head) = std::str::from_utf8(head) else { return };
    let mut lines = head.split('\n');
    let (secret, public_key) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    let now: i64 = lines.next().unwrap_or("").parse().unwrap_or(0);
    let pairs: Vec<(&str, &str)> =
        lines.map(|line| line.split_once(':').map_or((line, ""), |(n, v)| (n, v.trim_start()))).collect();

    let fallback = SigningKey::decode("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("a valid secret");
    let key = SigningKey::decode(secret).unwrap_or_else(|_| fallback.clone());
    if let Ok(parsed) = SigningKey::parse_endpoint_secret(secret) {
        assert_eq!(SigningKey::parse_endpoint_secret(&parsed.to_secret_string()).as_ref(), Ok(&parsed));
    }
    let _ = AsymmetricKey::parse(secret);

    // Arbitrary headers: any verdict, but no panic.
    let headers = SignedHeaders::from_pairs(pairs.iter().copied());
    let _ = verify(&key, &headers, body, now);
    let _ = verify_v1a(public_key, &headers, body, now);

    // What Herald signs verifies: the fuzzed id (or none), `now` as the timestamp.
    let id = headers.id.unwrap_or("");
    let ts = now.to_string();
    for keys in [vec![&key], vec![&fallback, &key]] {
        let signature = signature_header(keys.iter().copied(), id, now, body);
        let sent = [("webhook-id", id), ("Webhook-Timestamp", ts.as_str()), ("WEBHOOK-SIGNATURE", &signature)];
        let sent = SignedHeaders::from_pairs(sent);
        for receiver in &keys {
            for at in [now.saturating_sub(TOLERANCE_SECS), now.saturating_add(TOLERANCE_SECS)] {
                assert_eq!(verify(receiver, &sent, body, at), Ok(()), "{signature} at {at}");
            }
        }
    }
});
