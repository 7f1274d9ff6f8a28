//! The client side of SCRAM (RFC 5802) with SHA-256 or SHA-512 (RFC 7677), as Kafka's
//! `SCRAM-SHA-256` and `SCRAM-SHA-512` use it: the password never crosses the wire, and
//! the broker proves it knows the password too. The broker chooses the iteration count,
//! so it is bounded: a hostile broker must not make Herald hash for seconds.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::{Digest, Sha256, Sha512};

/// Kafka's own ceiling on SCRAM iterations.
const MAX_ITERATIONS: u32 = 16_384;

/// The hash a mechanism uses.
#[derive(Debug, Clone, Copy)]
pub enum Hash {
    Sha256,
    Sha512,
}

impl Hash {
    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
            parts.iter().for_each(|p| mac.update(p));
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            Self::Sha256 => run::<Hmac<Sha256>>(key, parts),
            Self::Sha512 => run::<Hmac<Sha512>>(key, parts),
        }
    }

    fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            Self::Sha256 => Sha256::digest(data).to_vec(),
            Self::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// `Hi()`: PBKDF2 with this HMAC, one block.
    fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut u = self.hmac(password, &[salt, &1u32.to_be_bytes()]);
        let mut out = u.clone();
        for _ in 1..iterations {
            u = self.hmac(password, &[&u]);
            out.iter_mut().zip(&u).for_each(|(o, b)| *o ^= b);
        }
        out
    }
}

/// One SCRAM exchange, from the client's first message to checking the server's proof.
pub struct Exchange {
    hash: Hash,
    password: String,
    client_first_bare: String,
    nonce: String,
    server_signature: Vec<u8>,
}

impl Exchange {
    /// Starts an exchange for `user`; the client's first message.
    pub fn start(hash: Hash, user: &str, password: &str) -> (Self, Vec<u8>) {
        let nonce: String = (0..24).map(|_| rand::rng().sample(rand::distr::Alphanumeric) as char).collect();
        Self::with_nonce(hash, user, password, nonce)
    }

    fn with_nonce(hash: Hash, user: &str, password: &str, nonce: String) -> (Self, Vec<u8>) {
        let user = user.replace('=', "=3D").replace(',', "=2C");
        let client_first_bare = format!("n={user},r={nonce}");
        let first = format!("n,,{client_first_bare}").into_bytes();
        let exchange =
            Self { hash, password: password.to_owned(), client_first_bare, nonce, server_signature: Vec::new() };
        (exchange, first)
    }

    /// The client's final message, answering the server's first.
    pub fn answer(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let server_first = std::str::from_utf8(server_first).map_err(|_| "the broker's SCRAM message is not UTF-8")?;
        let field = |name: char| {
            server_first.split(',').find_map(|part| part.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
        };
        let nonce = field('r').ok_or("the broker's SCRAM message has no nonce")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the broker's SCRAM nonce does not extend Herald's".into());
        }
        let salt = STANDARD.decode(field('s').ok_or("no salt")?).map_err(|_| "the broker's salt is not base64")?;
        let iterations: u32 = field('i').and_then(|i| i.parse().ok()).ok_or("no iteration count")?;
        if !(1..=MAX_ITERATIONS).contains(&iterations) {
            return Err(format!("the broker asks for {iterations} SCRAM iterations (at most {MAX_ITERATIONS})"));
        }
        let salted = self.hash.salted_password(self.password.as_bytes(), &salt, iterations);
        let client_key = self.hash.hmac(&salted, &[b"Client Key"]);
        let stored_key = self.hash.digest(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = self.hash.hmac(&stored_key, &[auth_message.as_bytes()]);
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
        let server_key = self.hash.hmac(&salted, &[b"Server Key"]);
        self.server_signature = self.hash.hmac(&server_key, &[auth_message.as_bytes()]);
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Checks the server's final message: its proof that it knows the password.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), String> {
        let server_final = String::from_utf8_lossy(server_final);
        if let Some(error) = server_final.strip_prefix("e=") {
            return Err(format!("the broker refused: {error}"));
        }
        let signature = server_final.strip_prefix("v=").and_then(|v| STANDARD.decode(v).ok());
        match signature {
            Some(s) if !self.server_signature.is_empty() && s == self.server_signature => Ok(()),
            _ => Err("the broker's SCRAM signature is wrong: it does not know the password".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677, section 3: user "user", password "pencil".
    #[test]
    fn the_rfc_7677_exchange_is_reproduced() {
        let (mut exchange, first) = Exchange::with_nonce(Hash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(first, b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let last = exchange.answer(server_first).unwrap();
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert!(exchange.verify(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_ok());
        assert!(exchange.verify(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").is_err());
        assert!(exchange.verify(b"e=invalid-proof").unwrap_err().contains("invalid-proof"));
    }

    #[test]
    fn a_hostile_server_first_message_is_refused() {
        let start = || Exchange::with_nonce(Hash::Sha512, "u,=", "p", "abc".into());
        assert_eq!(start().1, b"n,,n=u=2C=3D,r=abc");
        for hostile in [
            "r=abc,s=c2FsdA==,i=4096".to_owned(),
            "r=xyz1,s=c2FsdA==,i=4096".to_owned(),
            "r=abc1,s=c2FsdA==,i=4294967295".to_owned(),
            "r=abc1,s=c2FsdA==,i=0".to_owned(),
            "r=abc1,i=4096".to_owned(),
        ] {
            assert!(start().0.answer(hostile.as_bytes()).is_err(), "{hostile}");
        }
        assert!(start().0.answer(b"r=abc1,s=c2FsdA==,i=4096").is_ok());
    }
}
