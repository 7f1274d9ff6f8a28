//! Secrets at rest (`sealing::Keyring`, one random server key per run).
//!
//! Input layout: `<assoc>\n<other assoc>\n<rest>`; the rest is both the sealed text given
//! to `open`/`open_secrets` and the plaintext that is sealed.
//!
//! Properties:
//! - `open` and `open_secrets` never panic on any text and associated data;
//! - `open(seal(data, assoc), assoc) == data`;
//! - the sealed value does not open under another assoc (another endpoint's row), nor as
//!   another purpose (headers for secrets);
//! - a sealed value with one character replaced (by a base64url character or `.`) does
//!   not open.
#![no_main]

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::LazyLock;

use herald::ids::EndpointId;
use herald::sealing::{Keyring, Purpose, generate_key};
use herald::store::{SealedHeaders, SealedSecrets};
use libfuzzer_sys::fuzz_target;

static KEYRING: LazyLock<Keyring> =
    LazyLock::new(|| Keyring::new(&generate_key(), &[]).expect("a generated key is valid"));
static ENDPOINT: LazyLock<EndpointId> = LazyLock::new(EndpointId::generate);

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |b| *b == b'\n');
    let (Ok(assoc), Ok(other)) =
        (std::str::from_utf8(parts.next().unwrap_or(b"")), std::str::from_utf8(parts.next().unwrap_or(b"")))
    else {
        return;
    };
    let rest = parts.next().unwrap_or(b"");
    let ring = &*KEYRING;

    let text = String::from_utf8_lossy(rest);
    let _ = ring.open(Purpose::EndpointSecrets, &text, assoc);
    let _ = ring.open_headers(&SealedHeaders(text.to_string()), &ENDPOINT);
    let _ = ring.open_secrets(&SealedSecrets(text.into_owned()), &ENDPOINT);

    let sealed = ring.seal(Purpose::EndpointSecrets, rest, assoc);
    assert_eq!(ring.open(Purpose::EndpointSecrets, &sealed, assoc).as_deref(), Ok(rest));
    assert!(ring.open(Purpose::EndpointHeaders, &sealed, assoc).is_err(), "opened as another purpose");
    if other != assoc {
        assert!(ring.open(Purpose::EndpointSecrets, &sealed, other).is_err(), "opened under {other:?}");
    }

    // Which character, and what replaces it, follow from the input.
    let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(data);
    let mut tampered = sealed.into_bytes();
    let at = (hash % tampered.len() as u64) as usize;
    let with = b"Aa0-_."[((hash >> 32) % 6) as usize];
    if tampered[at] != with {
        tampered[at] = with;
        let tampered = String::from_utf8(tampered).expect("ASCII stays UTF-8");
        assert!(ring.open(Purpose::EndpointSecrets, &tampered, assoc).is_err(), "tampered {tampered:?} still opens");
    }
});
