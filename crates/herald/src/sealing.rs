//! Secrets at rest: endpoint signing secrets, endpoint headers, delivery credentials, event
//! destinations (with their broker credentials), proxy credentials, and stored idempotent
//! responses (which may carry a token or a secret). They are sealed with XChaCha20-Poly1305
//! under the server key before they reach a store, with what they are ([`Purpose`]) and
//! whose they are (the endpoint's id, the idempotency scope) as associated data, so a
//! sealed value copied onto another row does not open. Every sealed value names the key
//! that sealed it; old keys stay configured (`auth.previous_secret_keys`) until every row
//! has been rewritten under the current one.
//!
//! Sealed form: `v1.<key id>.<base64url(nonce ‖ ciphertext)>`, the key id being the first
//! four bytes of SHA-256 over the key, in hex.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::delivery_auth::Credentials;
use crate::destinations::Destination;
use crate::ids::EndpointId;
use crate::store::{Headers, SealedAuth, SealedDestination, SealedHeaders, SealedSecrets, Secrets};

const VERSION: &str = "v1";
const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

/// What a sealed value is: bound into its associated data, so a value of one kind never
/// opens as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    EndpointSecrets,
    EndpointHeaders,
    /// The credentials Herald presents to an endpoint's receiver.
    EndpointAuth,
    /// The credentials of an application's egress proxy.
    ProxyAuth,
    /// A response body kept for an idempotency key.
    StoredResponse,
    /// An endpoint's event destination, its broker credentials included.
    Destination,
}

impl Purpose {
    fn aad(self, associated: &str) -> String {
        let what = match self {
            Self::EndpointSecrets => "endpoint-secrets",
            Self::EndpointHeaders => "endpoint-headers",
            Self::EndpointAuth => "endpoint-auth",
            Self::ProxyAuth => "proxy-auth",
            Self::StoredResponse => "stored-response",
            Self::Destination => "destination",
        };
        format!("herald/{what}/{associated}")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    #[error("a server key must be 32 bytes, base64-encoded (generate one with `openssl rand -base64 32`)")]
    BadKey,
    #[error("the sealed value is malformed")]
    Malformed,
    #[error("the sealed value was sealed with key {0}, which is not configured")]
    UnknownKey(String),
    #[error("the sealed value does not open (wrong key, or it belongs to another row)")]
    DoesNotOpen,
}

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl Key {
    fn parse(encoded: &str) -> Result<Self, SealError> {
        let bytes = STANDARD.decode(encoded.trim()).map_err(|_| SealError::BadKey)?;
        if bytes.len() != KEY_BYTES {
            return Err(SealError::BadKey);
        }
        let digest = Sha256::digest(&bytes);
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { id, cipher: XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| SealError::BadKey)? })
    }
}

/// The current server key and the previous ones still accepted for opening.
pub struct Keyring {
    current: Key,
    previous: Vec<Key>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let previous: Vec<&str> = self.previous.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("current", &self.current.id).field("previous", &previous).finish()
    }
}

/// A new random server key, base64-encoded.
pub fn generate_key() -> String {
    let mut bytes = [0u8; KEY_BYTES];
    rand::rng().fill_bytes(&mut bytes);
    STANDARD.encode(bytes)
}

impl Keyring {
    pub fn new(current: &str, previous: &[String]) -> Result<Self, SealError> {
        let previous = previous.iter().map(|k| Key::parse(k)).collect::<Result<_, _>>()?;
        Ok(Self { current: Key::parse(current)?, previous })
    }

    /// The id of the key new values are sealed with.
    pub fn current_id(&self) -> &str {
        &self.current.id
    }

    pub fn seal(&self, purpose: Purpose, plaintext: &[u8], associated: &str) -> String {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        let aad = purpose.aad(associated);
        let sealed = self
            .current
            .cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: plaintext, aad: aad.as_bytes() })
            .expect("XChaCha20-Poly1305 encryption cannot fail for in-memory buffers");
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&sealed);
        format!("{VERSION}.{}.{}", self.current.id, URL_SAFE_NO_PAD.encode(blob))
    }

    pub fn open(&self, purpose: Purpose, sealed: &str, associated: &str) -> Result<Vec<u8>, SealError> {
        let mut parts = sealed.splitn(3, '.');
        let (Some(VERSION), Some(key_id), Some(blob)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SealError::Malformed);
        };
        let key = std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|k| k.id == key_id)
            .ok_or_else(|| SealError::UnknownKey(key_id.to_owned()))?;
        let blob = URL_SAFE_NO_PAD.decode(blob).map_err(|_| SealError::Malformed)?;
        if blob.len() < NONCE_BYTES {
            return Err(SealError::Malformed);
        }
        let (nonce, ciphertext) = blob.split_at(NONCE_BYTES);
        let aad = purpose.aad(associated);
        key.cipher
            .decrypt(XNonce::from_slice(nonce), Payload { msg: ciphertext, aad: aad.as_bytes() })
            .map_err(|_| SealError::DoesNotOpen)
    }

    /// Seals an endpoint's secrets for its row.
    pub fn seal_secrets(&self, secrets: &Secrets, endpoint: &EndpointId) -> SealedSecrets {
        let json = serde_json::to_vec(secrets).expect("secrets serialize");
        SealedSecrets(self.seal(Purpose::EndpointSecrets, &json, endpoint.as_str()))
    }

    /// Opens the secrets stored on an endpoint's row.
    pub fn open_secrets(&self, sealed: &SealedSecrets, endpoint: &EndpointId) -> Result<Secrets, SealError> {
        let json = self.open(Purpose::EndpointSecrets, &sealed.0, endpoint.as_str())?;
        serde_json::from_slice(&json).map_err(|_| SealError::Malformed)
    }

    /// Seals an endpoint's own headers for its row (none: the empty text).
    pub fn seal_headers(&self, headers: &Headers, endpoint: &EndpointId) -> SealedHeaders {
        if headers.is_empty() {
            return SealedHeaders::default();
        }
        let json = serde_json::to_vec(headers).expect("headers serialize");
        SealedHeaders(self.seal(Purpose::EndpointHeaders, &json, endpoint.as_str()))
    }

    /// Opens the headers stored on an endpoint's row. A row written before headers were
    /// sealed holds them as plain JSON; they read as such until the start-up pass seals them.
    pub fn open_headers(&self, sealed: &SealedHeaders, endpoint: &EndpointId) -> Result<Headers, SealError> {
        let json = match sealed.0.as_str() {
            "" => return Ok(Headers::new()),
            plain if sealed.is_plaintext() => plain.as_bytes().to_vec(),
            text => self.open(Purpose::EndpointHeaders, text, endpoint.as_str())?,
        };
        serde_json::from_slice(&json).map_err(|_| SealError::Malformed)
    }

    /// Seals what an endpoint presents to its receiver (none: empty text).
    pub fn seal_credentials(&self, credentials: &Credentials, endpoint: &EndpointId) -> SealedAuth {
        if credentials.is_empty() {
            return SealedAuth::default();
        }
        let json = serde_json::to_vec(credentials).expect("credentials serialize");
        SealedAuth(self.seal(Purpose::EndpointAuth, &json, endpoint.as_str()))
    }

    /// Opens what an endpoint presents to its receiver.
    pub fn open_credentials(&self, sealed: &SealedAuth, endpoint: &EndpointId) -> Result<Credentials, SealError> {
        if sealed.0.is_empty() {
            return Ok(Credentials::default());
        }
        let json = self.open(Purpose::EndpointAuth, &sealed.0, endpoint.as_str())?;
        Credentials::from_json(&json).ok_or(SealError::Malformed)
    }

    /// Seals an endpoint's event destination, credentials included (none: empty text).
    pub fn seal_destination(&self, destination: Option<&Destination>, endpoint: &EndpointId) -> SealedDestination {
        let Some(destination) = destination else { return SealedDestination::default() };
        let json = serde_json::to_vec(destination).expect("destinations serialize");
        SealedDestination(self.seal(Purpose::Destination, &json, endpoint.as_str()))
    }

    /// Opens an endpoint's event destination (`None`: it delivers over HTTP).
    pub fn open_destination(
        &self,
        sealed: &SealedDestination,
        endpoint: &EndpointId,
    ) -> Result<Option<Destination>, SealError> {
        if sealed.0.is_empty() {
            return Ok(None);
        }
        let json = self.open(Purpose::Destination, &sealed.0, endpoint.as_str())?;
        serde_json::from_slice(&json).map(Some).map_err(|_| SealError::Malformed)
    }

    /// Seals the `user:password` of an application's egress proxy (none: empty text).
    pub fn seal_proxy_credentials(&self, credentials: &str, app: &str) -> SealedAuth {
        if credentials.is_empty() {
            return SealedAuth::default();
        }
        SealedAuth(self.seal(Purpose::ProxyAuth, credentials.as_bytes(), app))
    }

    pub fn open_proxy_credentials(&self, sealed: &SealedAuth, app: &str) -> Result<String, SealError> {
        if sealed.0.is_empty() {
            return Ok(String::new());
        }
        String::from_utf8(self.open(Purpose::ProxyAuth, &sealed.0, app)?).map_err(|_| SealError::Malformed)
    }

    /// Whether a sealed value was sealed under an old key (and should be rewritten).
    pub fn is_stale(&self, sealed: &str) -> bool {
        sealed.split('.').nth(1) != Some(self.current.id.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::new(&generate_key(), &[]).unwrap()
    }

    fn secrets() -> Secrets {
        Secrets { current: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(), previous: vec![] }
    }

    #[test]
    fn sealed_secrets_open_for_their_own_endpoint_only() {
        let ring = ring();
        let (a, b) = (EndpointId::generate(), EndpointId::generate());
        let sealed = ring.seal_secrets(&secrets(), &a);
        assert!(!sealed.0.contains("MfKQ9r8"), "the plaintext must not show");
        assert_eq!(ring.open_secrets(&sealed, &a).unwrap(), secrets());
        assert_eq!(ring.open_secrets(&sealed, &b), Err(SealError::DoesNotOpen));
    }

    #[test]
    fn sealing_twice_gives_different_ciphertexts() {
        let ring = ring();
        let id = EndpointId::generate();
        assert_ne!(ring.seal_secrets(&secrets(), &id), ring.seal_secrets(&secrets(), &id));
    }

    #[test]
    fn a_previous_key_still_opens_and_marks_the_value_stale() {
        let (old, new) = (generate_key(), generate_key());
        let id = EndpointId::generate();
        let sealed = Keyring::new(&old, &[]).unwrap().seal_secrets(&secrets(), &id);
        let rotated = Keyring::new(&new, &[old]).unwrap();
        assert!(rotated.is_stale(&sealed.0));
        assert_eq!(rotated.open_secrets(&sealed, &id).unwrap(), secrets());
        let resealed = rotated.seal_secrets(&secrets(), &id);
        assert!(!rotated.is_stale(&resealed.0));
        let forgotten = Keyring::new(&new, &[]).unwrap();
        assert!(matches!(forgotten.open_secrets(&sealed, &id), Err(SealError::UnknownKey(_))));
    }

    #[test]
    fn a_value_sealed_for_one_purpose_does_not_open_as_another() {
        let ring = ring();
        let id = EndpointId::generate();
        let sealed = ring.seal_secrets(&secrets(), &id);
        assert_eq!(ring.open(Purpose::EndpointHeaders, &sealed.0, id.as_str()), Err(SealError::DoesNotOpen));
        assert_eq!(ring.open(Purpose::StoredResponse, &sealed.0, id.as_str()), Err(SealError::DoesNotOpen));
    }

    #[test]
    fn headers_are_sealed_and_legacy_plain_ones_still_read() {
        let ring = ring();
        let id = EndpointId::generate();
        let headers = Headers::from([("authorization".to_owned(), "Bearer sk_live_canary".to_owned())]);
        let sealed = ring.seal_headers(&headers, &id);
        assert!(!sealed.0.contains("canary") && !sealed.is_plaintext());
        assert_eq!(ring.open_headers(&sealed, &id).unwrap(), headers);
        assert_eq!(ring.seal_headers(&Headers::new(), &id), SealedHeaders::default());
        assert_eq!(ring.open_headers(&SealedHeaders::default(), &id).unwrap(), Headers::new());
        let legacy = SealedHeaders(r#"{"x-a":"1"}"#.into());
        assert!(legacy.is_plaintext());
        assert_eq!(ring.open_headers(&legacy, &id).unwrap()["x-a"], "1");
    }

    #[test]
    fn tampering_and_garbage_are_refused() {
        let ring = ring();
        let id = EndpointId::generate();
        let sealed = ring.seal_secrets(&secrets(), &id).0;
        let mut flipped = sealed.clone().into_bytes();
        let last = flipped.len() - 2;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        let flipped = SealedSecrets(String::from_utf8(flipped).unwrap());
        assert_eq!(ring.open_secrets(&flipped, &id), Err(SealError::DoesNotOpen));
        for garbage in
            ["", "v1", "v1..", "v2.x.y", "{\"current\":\"whsec_x\"}", &format!("v1.{}.!!", ring.current_id())]
        {
            assert!(ring.open_secrets(&SealedSecrets(garbage.into()), &id).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn keys_must_be_32_bytes_of_base64() {
        assert_eq!(Keyring::new("c2hvcnQ=", &[]).unwrap_err(), SealError::BadKey);
        assert_eq!(Keyring::new("not base64!", &[]).unwrap_err(), SealError::BadKey);
        assert!(Keyring::new(&generate_key(), &["bad".into()]).is_err());
    }

    #[test]
    fn debug_shows_key_ids_not_keys() {
        let key = generate_key();
        let ring = Keyring::new(&key, &[]).unwrap();
        let shown = format!("{ring:?}");
        assert!(shown.contains(ring.current_id()) && !shown.contains(&key));
    }
}
