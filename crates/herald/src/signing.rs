//! Standard Webhooks signing: `webhook-signature: v1,<base64 HMAC-SHA256("{id}.{ts}.{body}")>`.
//!
//! Endpoint secrets are `whsec_<base64>` (24 to 64 random bytes), or, for the asymmetric
//! `v1a` scheme, `whsk_<base64 of an ed25519 key pair>`: deliveries are then signed with
//! ed25519 over the same content, and receivers verify with the public `whpk_` key
//! ([`EndpointKey`]). During a rotation every secret still inside its overlap signs, and
//! the signatures are sent space-separated, so a receiver holding either the old or the new
//! secret verifies.

use base64::Engine;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::{DecodePaddingMode, general_purpose};
use ed25519_dalek::{Signer, Verifier};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Prefix of symmetric signing secrets.
pub const SECRET_PREFIX: &str = "whsec_";
/// Prefix of asymmetric (ed25519) signing secrets.
pub const ASYMMETRIC_PREFIX: &str = "whsk_";
/// Accepted timestamp skew when verifying, as in every official library.
pub const TOLERANCE_SECS: i64 = 300;

/// Standard base64 that accepts input with or without padding (some senders strip it).
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "secret must be base64 of 24 to 64 bytes, optionally prefixed with whsec_, or an ed25519 key pair as whsk_<base64>"
    )]
    Invalid,
}

/// Anything that signs a message's content: `v1,…` or `v1a,…`.
pub trait Sign {
    fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String;
}

/// An endpoint's signing key: a symmetric `whsec_` key, or an asymmetric `whsk_` one.
#[derive(Clone, Debug)]
pub enum EndpointKey {
    Hmac(SigningKey),
    Ed25519(AsymmetricKey),
}

impl EndpointKey {
    /// A stored secret (`whsec_…` or `whsk_…`).
    pub fn decode(secret: &str) -> Result<Self, SecretError> {
        if secret.starts_with(ASYMMETRIC_PREFIX) {
            AsymmetricKey::parse(secret).map(Self::Ed25519)
        } else {
            SigningKey::decode(secret).map(Self::Hmac)
        }
    }

    /// Validates a secret given at endpoint creation or rotation; its canonical form.
    pub fn parse_endpoint_secret(secret: &str) -> Result<String, SecretError> {
        if secret.starts_with(ASYMMETRIC_PREFIX) {
            AsymmetricKey::parse(secret).map(|_| secret.to_owned())
        } else {
            SigningKey::parse_endpoint_secret(secret).map(|key| key.to_secret_string())
        }
    }

    /// What `GET …/secret` shows: the `whsec_` secret, or the `whpk_` public key (the
    /// private half never leaves Herald).
    pub fn shown(secret: &str) -> Result<String, SecretError> {
        Ok(match Self::decode(secret)? {
            Self::Hmac(key) => key.to_secret_string(),
            Self::Ed25519(key) => key.public_key(),
        })
    }
}

impl Sign for EndpointKey {
    fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        match self {
            Self::Hmac(key) => key.sign(msg_id, timestamp, body),
            Self::Ed25519(key) => key.sign(msg_id, timestamp, body),
        }
    }
}

/// A symmetric signing key (the decoded bytes of a `whsec_` secret).
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach logs, not even through Debug.
        f.write_str("SigningKey(<redacted>)")
    }
}

impl SigningKey {
    /// A fresh 24-byte key, the size Svix generates.
    pub fn generate() -> Self {
        let mut bytes = vec![0u8; 24];
        rand::rng().fill_bytes(&mut bytes);
        Self(bytes)
    }

    /// Decodes any secret a sender might hold (prefix optional, padding optional).
    /// Use [`SigningKey::parse_endpoint_secret`] for secrets users register.
    pub fn decode(secret: &str) -> Result<Self, SecretError> {
        let body = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
        match LENIENT.decode(body) {
            Ok(bytes) if !bytes.is_empty() => Ok(Self(bytes)),
            _ => Err(SecretError::Invalid),
        }
    }

    /// Validates a secret given at endpoint creation or rotation: the Svix pattern
    /// `^(whsec_)?[a-zA-Z0-9+/=]{32,100}$` and 24 to 64 decoded bytes.
    pub fn parse_endpoint_secret(secret: &str) -> Result<Self, SecretError> {
        let body = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
        let charset_ok = body.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
        if !charset_ok || !(32..=100).contains(&body.len()) {
            return Err(SecretError::Invalid);
        }
        let key = Self::decode(body)?;
        if (24..=64).contains(&key.0.len()) { Ok(key) } else { Err(SecretError::Invalid) }
    }

    /// The canonical `whsec_…` form.
    pub fn to_secret_string(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any size");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }
}

impl Sign for SigningKey {
    /// `v1,<base64>` for one message.
    fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", STANDARD.encode(self.mac(msg_id, timestamp, body)))
    }
}

/// The `webhook-signature` header value: one entry per key, space-separated.
pub fn signature_header<'a, K: Sign + 'a>(
    keys: impl IntoIterator<Item = &'a K>,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let mut header = String::new();
    for key in keys {
        if !header.is_empty() {
            header.push(' ');
        }
        header.push_str(&key.sign(msg_id, timestamp, body));
    }
    header
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing webhook-id, webhook-timestamp or webhook-signature")]
    MissingRequiredHeaders,
    #[error("webhook-timestamp is not an integer")]
    InvalidTimestamp,
    #[error("webhook-timestamp is too old")]
    TimestampTooOld,
    #[error("webhook-timestamp is in the future")]
    TimestampTooNew,
    #[error("no signature matches")]
    NoMatchingSignature,
}

/// The three signed headers as a receiver sees them.
pub struct SignedHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

impl<'a> SignedHeaders<'a> {
    /// Picks the headers out of `(name, value)` pairs, names compared case-insensitively.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut headers = Self { id: None, timestamp: None, signature: None };
        for (name, value) in pairs {
            match name.to_ascii_lowercase().as_str() {
                "webhook-id" => headers.id = Some(value),
                "webhook-timestamp" => headers.timestamp = Some(value),
                "webhook-signature" => headers.signature = Some(value),
                _ => {}
            }
        }
        headers
    }

    fn checked(&self, now: i64) -> Result<(&'a str, i64, &'a str), VerifyError> {
        let (Some(id), Some(ts), Some(sig)) = (self.id, self.timestamp, self.signature) else {
            return Err(VerifyError::MissingRequiredHeaders);
        };
        let ts: i64 = ts.parse().map_err(|_| VerifyError::InvalidTimestamp)?;
        if now.saturating_sub(ts) > TOLERANCE_SECS {
            return Err(VerifyError::TimestampTooOld);
        }
        if ts.saturating_sub(now) > TOLERANCE_SECS {
            return Err(VerifyError::TimestampTooNew);
        }
        Ok((id, ts, sig))
    }
}

/// Verifies a symmetric (`v1`) signature as a receiver would, with `now` in unix seconds.
pub fn verify(key: &SigningKey, headers: &SignedHeaders<'_>, body: &[u8], now: i64) -> Result<(), VerifyError> {
    let (id, ts, signatures) = headers.checked(now)?;
    let expected = key.mac(id, ts, body);
    let matched = signatures
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1")
        .filter_map(|(_, value)| STANDARD.decode(value).ok())
        .any(|given| bool::from(given.as_slice().ct_eq(&expected)));
    matched.then_some(()).ok_or(VerifyError::NoMatchingSignature)
}

/// An ed25519 key pair for the asymmetric `v1a` scheme (`whsk_` secret, `whpk_` public key).
#[derive(Clone)]
pub struct AsymmetricKey(ed25519_dalek::SigningKey);

impl std::fmt::Debug for AsymmetricKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AsymmetricKey(<redacted>)")
    }
}

impl AsymmetricKey {
    /// Parses `whsk_<base64 of seed || public key>` (64 bytes).
    pub fn parse(secret: &str) -> Result<Self, SecretError> {
        let body = secret.strip_prefix(ASYMMETRIC_PREFIX).ok_or(SecretError::Invalid)?;
        let bytes = general_purpose::STANDARD.decode(body).map_err(|_| SecretError::Invalid)?;
        let pair: [u8; 64] = bytes.try_into().map_err(|_| SecretError::Invalid)?;
        ed25519_dalek::SigningKey::from_keypair_bytes(&pair).map(Self).map_err(|_| SecretError::Invalid)
    }

    /// A fresh key pair.
    pub fn generate() -> Self {
        let mut seed = [0u8; 32];
        rand::rng().fill_bytes(&mut seed);
        Self(ed25519_dalek::SigningKey::from_bytes(&seed))
    }

    /// The `whsk_…` form (seed and public key).
    pub fn to_secret_string(&self) -> String {
        format!("{ASYMMETRIC_PREFIX}{}", STANDARD.encode(self.0.to_keypair_bytes()))
    }

    pub fn public_key(&self) -> String {
        format!("whpk_{}", STANDARD.encode(self.0.verifying_key().as_bytes()))
    }
}

impl Sign for AsymmetricKey {
    fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let content = signed_content(msg_id, timestamp, body);
        format!("v1a,{}", STANDARD.encode(self.0.sign(&content).to_bytes()))
    }
}

/// Verifies an asymmetric (`v1a`) signature against a `whpk_` public key.
pub fn verify_v1a(public_key: &str, headers: &SignedHeaders<'_>, body: &[u8], now: i64) -> Result<(), VerifyError> {
    let (id, ts, signatures) = headers.checked(now)?;
    let key = public_key
        .strip_prefix("whpk_")
        .and_then(|b64| STANDARD.decode(b64).ok())
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .and_then(|bytes| ed25519_dalek::VerifyingKey::from_bytes(&bytes).ok())
        .ok_or(VerifyError::NoMatchingSignature)?;
    let content = signed_content(id, ts, body);
    let matched = signatures
        .split(' ')
        .filter_map(|entry| entry.split_once(','))
        .filter(|(version, _)| *version == "v1a")
        .filter_map(|(_, value)| STANDARD.decode(value).ok())
        .filter_map(|bytes| ed25519_dalek::Signature::from_slice(&bytes).ok())
        .any(|signature| key.verify(&content, &signature).is_ok());
    matched.then_some(()).ok_or(VerifyError::NoMatchingSignature)
}

fn signed_content(msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut content = format!("{msg_id}.{timestamp}.").into_bytes();
    content.extend_from_slice(body);
    content
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const VECTORS: &str = include_str!("../../../contracts/standard-webhooks-vectors.json");

    fn vectors(kind: &str) -> Vec<Value> {
        let doc: Value = serde_json::from_str(VECTORS).unwrap();
        let all = doc["vectors"].as_array().unwrap();
        let picked: Vec<Value> = all.iter().filter(|v| v["kind"] == kind).cloned().collect();
        assert!(!picked.is_empty(), "no vectors of kind {kind}");
        picked
    }

    fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
        v[field].as_str().unwrap_or_else(|| panic!("{} lacks {field}", v["name"]))
    }

    fn headers_of(v: &Value) -> Vec<(String, String)> {
        v["headers"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())).collect()
    }

    #[test]
    fn every_sign_vector_produces_the_expected_signature() {
        for v in vectors("sign") {
            let key = SigningKey::decode(str_of(&v, "secret")).unwrap();
            let ts = v["timestamp"].as_i64().unwrap();
            let sig = key.sign(str_of(&v, "msg_id"), ts, str_of(&v, "payload").as_bytes());
            assert_eq!(sig, str_of(&v, "expected_signature"), "vector {}", v["name"]);
        }
    }

    #[test]
    fn every_verify_vector_gives_the_expected_verdict() {
        for v in vectors("verify") {
            let key = SigningKey::decode(str_of(&v, "secret")).unwrap();
            let pairs = headers_of(&v);
            let headers = SignedHeaders::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let now = v["now"].as_i64().unwrap();
            let result = verify(&key, &headers, str_of(&v, "payload").as_bytes(), now);
            let expected_valid = v["expected_valid"].as_bool().unwrap();
            assert_eq!(result.is_ok(), expected_valid, "vector {}: {result:?}", v["name"]);
            if let Some(error) = v["expected_error"].as_str() {
                let expected = match error {
                    "missing_required_headers" => VerifyError::MissingRequiredHeaders,
                    "invalid_timestamp" => VerifyError::InvalidTimestamp,
                    "timestamp_too_old" => VerifyError::TimestampTooOld,
                    "timestamp_too_new" => VerifyError::TimestampTooNew,
                    "no_matching_signature" => VerifyError::NoMatchingSignature,
                    other => panic!("unknown expected_error {other}"),
                };
                assert_eq!(result, Err(expected), "vector {}", v["name"]);
            }
        }
    }

    #[test]
    fn every_v1a_sign_vector_produces_the_expected_signature() {
        for v in vectors("sign_v1a") {
            let key = AsymmetricKey::parse(str_of(&v, "secret_key_whsk")).unwrap();
            assert_eq!(key.public_key(), str_of(&v, "public_key_whpk"));
            let ts = v["timestamp"].as_i64().unwrap();
            let sig = key.sign(str_of(&v, "msg_id"), ts, str_of(&v, "payload").as_bytes());
            assert_eq!(sig, str_of(&v, "expected_signature"), "vector {}", v["name"]);
        }
    }

    #[test]
    fn every_v1a_verify_vector_gives_the_expected_verdict() {
        for v in vectors("verify_v1a") {
            let pairs = headers_of(&v);
            let headers = SignedHeaders::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let now = v["now"].as_i64().unwrap();
            let result = verify_v1a(str_of(&v, "public_key_whpk"), &headers, str_of(&v, "payload").as_bytes(), now);
            assert_eq!(result.is_ok(), v["expected_valid"].as_bool().unwrap(), "vector {}", v["name"]);
        }
    }

    #[test]
    fn endpoint_secret_inputs_are_judged_like_the_vectors() {
        for v in vectors("endpoint_secret_input").into_iter().chain(vectors("secret")) {
            let parsed = SigningKey::parse_endpoint_secret(str_of(&v, "secret"));
            assert_eq!(parsed.is_ok(), v["expected_valid"].as_bool().unwrap(), "vector {}", v["name"]);
            if let (Ok(key), Some(hex)) = (parsed, v["key_hex"].as_str()) {
                let got: String = key.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
                assert_eq!(got, hex, "vector {}", v["name"]);
            }
        }
    }

    #[test]
    fn rotation_header_carries_one_signature_per_key_and_each_verifies() {
        let old = SigningKey::generate();
        let new = SigningKey::generate();
        let header = signature_header([&new, &old], "msg_1", 1_700_000_000, b"{}");
        assert_eq!(header.split(' ').count(), 2);
        for key in [&old, &new] {
            let headers = SignedHeaders { id: Some("msg_1"), timestamp: Some("1700000000"), signature: Some(&header) };
            assert_eq!(verify(key, &headers, b"{}", 1_700_000_000), Ok(()));
        }
    }

    #[test]
    fn generated_secrets_round_trip_through_the_endpoint_parser() {
        let key = SigningKey::generate();
        let parsed = SigningKey::parse_endpoint_secret(&key.to_secret_string()).unwrap();
        assert_eq!(parsed, key);
        assert_eq!(format!("{key:?}"), "SigningKey(<redacted>)");
    }
}
