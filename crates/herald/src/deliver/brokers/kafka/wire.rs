//! One connection to one Kafka broker: opened through the destination guard (the
//! `Dialer`: TLS, the endpoint's client certificate, the egress proxy), versions agreed
//! (`ApiVersions`), authenticated (SASL PLAIN or SCRAM), then requests in Kafka's framing.
//! A broker answers a connection's requests in the order they came, so each request's
//! reply waits in a queue; a reply larger than `MAX_FRAME` or out of order ends the
//! connection. Requests are encoded by `kafka-protocol`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::super::{Dialer, PublishError};
use super::scram;
use crate::destinations::{Address, BrokerCredentials, SaslMechanism};
use crate::outcome::Failure;

/// Largest reply read: a produce or metadata answer is far smaller.
const MAX_FRAME: usize = 16 * 1024 * 1024;
/// Requests queued on one connection before callers wait.
const QUEUE: usize = 256;

/// The versions of each request Herald speaks: the newest both sides know is used.
/// (`kafka-protocol` pairs requests with replies only with its broker half compiled in.)
pub(super) trait Versioned: Encodable {
    const KEY: ApiKey;
    const OURS: (i16, i16);
    type Response: Decodable;
}

/// Declares which reply answers a request, under which key, in which versions.
macro_rules! versioned {
    ($($request:ident => $response:ident, $key:ident, $ours:expr;)*) => {$(
        impl Versioned for kafka_protocol::messages::$request {
            const KEY: ApiKey = ApiKey::$key;
            const OURS: (i16, i16) = $ours;
            type Response = kafka_protocol::messages::$response;
        }
    )*};
}

versioned! {
    ApiVersionsRequest => ApiVersionsResponse, ApiVersions, (0, 0);
    SaslHandshakeRequest => SaslHandshakeResponse, SaslHandshake, (1, 1);
    SaslAuthenticateRequest => SaslAuthenticateResponse, SaslAuthenticate, (0, 2);
    MetadataRequest => MetadataResponse, Metadata, (4, 12);
    InitProducerIdRequest => InitProducerIdResponse, InitProducerId, (0, 4);
    ProduceRequest => ProduceResponse, Produce, (3, 11);
}

/// A reply's bytes, or why none came.
type Reply = Result<Bytes, String>;
/// Requests written and not yet answered: their correlation id and who waits.
type Waiting = Arc<Mutex<VecDeque<(i32, oneshot::Sender<Reply>)>>>;

/// An open, authenticated connection to one broker; dropped, it closes.
pub(super) struct Wire {
    frames: mpsc::Sender<(i32, Bytes, oneshot::Sender<Reply>)>,
    next_id: AtomicI32,
    /// The broker's (min, max) version of each API it offers.
    versions: HashMap<i16, (i16, i16)>,
    task: tokio::task::AbortHandle,
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Wire {
    /// Connects to `address`, agrees versions and authenticates with `credentials` (if
    /// they have a user name) by `mechanism`.
    pub async fn open(
        dialer: &Dialer,
        address: &Address,
        credentials: &BrokerCredentials,
        mechanism: SaslMechanism,
    ) -> Result<Self, PublishError> {
        let stream = dialer.stream(address).await?;
        let (frames, queued) = mpsc::channel(QUEUE);
        let task = tokio::spawn(run(stream, queued)).abort_handle();
        let mut wire = Self { frames, next_id: AtomicI32::new(1), versions: HashMap::new(), task };
        let setup = async {
            wire.agree_versions().await?;
            if let (Some(user), Some(password)) = (&credentials.username, &credentials.password) {
                // A broker that refuses may just close the connection (as Kafka before 1.0 did).
                wire.authenticate(mechanism, user, password).await.map_err(|e| match e.failure {
                    Failure::Connection => {
                        let why = format!("SASL {}: the broker closed the connection ({})", mechanism.name(), e.why);
                        PublishError::new(Failure::BrokerAuth, why, true)
                    }
                    _ => e,
                })?;
            }
            Ok(())
        };
        let outcome = tokio::time::timeout(dialer.budget, setup).await;
        match outcome {
            Err(_) => Err(PublishError::new(Failure::Timeout, "the broker did not finish the handshake in time", true)),
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) => Ok(wire),
        }
    }

    /// Sends `request` at the newest version both sides know; the broker's answer.
    pub async fn call<R: Versioned>(&self, request: &R) -> Result<R::Response, PublishError> {
        let key = R::KEY;
        let Some(&(min, max)) = self.versions.get(&(key as i16)) else {
            return Err(PublishError::new(Failure::BrokerRefused, format!("the broker does not offer {key:?}"), true));
        };
        let version = max.min(R::OURS.1);
        if version < min.max(R::OURS.0) {
            let why = format!("the broker offers {key:?} versions {min} to {max}, Herald speaks {:?}", R::OURS);
            return Err(PublishError::new(Failure::BrokerRefused, why, true));
        }
        self.call_at(request, key, version).await
    }

    async fn call_at<R: Versioned>(&self, request: &R, key: ApiKey, version: i16) -> Result<R::Response, PublishError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(id)
            .with_client_id(Some(StrBytes::from_static_str("herald")));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        let encoded = header
            .encode(&mut frame, key.request_header_version(version))
            .and_then(|()| request.encode(&mut frame, version));
        encoded.map_err(|e| PublishError::new(Failure::Internal, format!("encoding a {key:?} request: {e}"), false))?;
        let size = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        let (reply, answer) = oneshot::channel();
        self.frames.send((id, frame.freeze(), reply)).await.map_err(|_| broken("the connection is closed"))?;
        let mut body = answer.await.map_err(|_| broken("the connection closed"))?.map_err(broken)?;
        ResponseHeader::decode(&mut body, key.response_header_version(version))
            .and_then(|_| R::Response::decode(&mut body, version))
            .map_err(|e| broken(format!("the broker's {key:?} answer does not parse: {e}")))
    }

    async fn agree_versions(&mut self) -> Result<(), PublishError> {
        let request = ApiVersionsRequest::default();
        let answer = self.call_at(&request, ApiKey::ApiVersions, 0).await?;
        if let Some(e) = ResponseError::try_from_code(answer.error_code) {
            return Err(PublishError::new(Failure::BrokerRefused, format!("ApiVersions: {e}"), true));
        }
        self.versions = answer.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(())
    }

    async fn authenticate(&self, mechanism: SaslMechanism, user: &str, password: &str) -> Result<(), PublishError> {
        let handshake = self.call(&SaslHandshakeRequest::default().with_mechanism(mechanism.name().into())).await?;
        if let Some(e) = ResponseError::try_from_code(handshake.error_code) {
            let offered: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            let why = format!("SASL {}: {e} (the broker offers {offered:?})", mechanism.name());
            return Err(PublishError::new(Failure::BrokerAuth, why, true));
        }
        let hash = match mechanism {
            SaslMechanism::Plain => {
                self.sasl(format!("\0{user}\0{password}").into_bytes()).await?;
                return Ok(());
            }
            SaslMechanism::ScramSha256 => scram::Hash::Sha256,
            SaslMechanism::ScramSha512 => scram::Hash::Sha512,
        };
        let (mut exchange, first) = scram::Exchange::start(hash, user, password);
        let server_first = self.sasl(first).await?;
        let (last, exchange) = tokio::task::spawn_blocking(move || (exchange.answer(&server_first), exchange))
            .await
            .map_err(|e| PublishError::new(Failure::Internal, format!("SCRAM: {e}"), true))?;
        let refused = |why| PublishError::new(Failure::BrokerAuth, format!("SASL {}: {why}", mechanism.name()), true);
        let server_final = self.sasl(last.map_err(refused)?).await?;
        exchange.verify(&server_final).map_err(refused)
    }

    /// One SASL round: Herald's bytes, the broker's.
    async fn sasl(&self, bytes: Vec<u8>) -> Result<Bytes, PublishError> {
        let answer = self.call(&SaslAuthenticateRequest::default().with_auth_bytes(bytes.into())).await?;
        match ResponseError::try_from_code(answer.error_code) {
            None => Ok(answer.auth_bytes),
            Some(e) => {
                let message = answer.error_message.as_ref().map(|m| m.as_str()).unwrap_or_default();
                Err(PublishError::new(Failure::BrokerAuth, format!("SASL: {e} {message}").trim_end().to_owned(), true))
            }
        }
    }
}

fn broken(why: impl Into<String>) -> PublishError {
    PublishError::new(Failure::Connection, why, true)
}

/// Writes queued frames and reads replies in order until either side fails.
async fn run(stream: Box<dyn super::super::Io>, mut queued: mpsc::Receiver<(i32, Bytes, oneshot::Sender<Reply>)>) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let waiting: Waiting = Arc::default();
    let write = async {
        while let Some((id, frame, reply)) = queued.recv().await {
            waiting.lock().unwrap_or_else(|e| e.into_inner()).push_back((id, reply));
            if let Err(e) = writer.write_all(&frame).await {
                return format!("writing to the broker: {e}");
            }
        }
        "closed".to_owned()
    };
    let read = async {
        loop {
            let size = match reader.read_i32().await {
                Ok(size) => size,
                Err(e) => return format!("reading from the broker: {e}"),
            };
            if size < 4 || size as usize > MAX_FRAME {
                return format!("the broker sent a frame of {size} bytes (at most {MAX_FRAME})");
            }
            let mut body = vec![0; size as usize];
            if let Err(e) = reader.read_exact(&mut body).await {
                return format!("reading from the broker: {e}");
            }
            let mut body = Bytes::from(body);
            let id = body.clone().get_i32();
            let next = waiting.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            match next {
                Some((expected, reply)) if expected == id => {
                    let _ = reply.send(Ok(std::mem::take(&mut body)));
                }
                _ => return format!("the broker answered request {id} out of order"),
            }
        }
    };
    let why = tokio::select! { why = write => why, why = read => why };
    for (_, reply) in waiting.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = reply.send(Err(why.clone()));
    }
}
