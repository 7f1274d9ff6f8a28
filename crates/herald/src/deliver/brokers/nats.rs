//! NATS JetStream. A message is published (`HPUB`) to the destination's subject with its
//! headers, and delivered once JetStream acknowledges it (`{"stream": "ORDERS", "seq": 42}`):
//! the stream that takes the subject has stored it, on a quorum of its replicas in a
//! cluster. No stream on the subject answers "no responders": the destination is missing.
//!
//! Herald speaks the protocol itself, over the stream it opened through the destination
//! guard: the `async-nats` client dials its own sockets (and the servers a broker
//! advertises), so it could not be held to the guard or the egress proxy. Only what
//! publishing needs is here: the INFO/CONNECT handshake (TLS after INFO, as NATS does it),
//! PING/PONG, one inbox subscription for the acknowledgements, and `HPUB`. Everything a
//! broker sends is bounded in size before it is read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use super::{Acknowledgement, Dialer, Io, Outbound, PublishError};
use crate::destinations::{Address, BrokerCredentials};
use crate::outcome::Failure;

/// Longest protocol line read (`INFO` is the longest a broker sends).
const MAX_LINE: usize = 64 * 1024;
/// Largest message read from the inbox: acknowledgements are a few dozen bytes.
const MAX_REPLY: usize = 64 * 1024;
/// Frames queued for the writer before a publisher waits.
const QUEUED_FRAMES: usize = 1024;

/// A connection to one NATS server: a cheap handle every attempt clones.
#[derive(Clone)]
pub(super) struct Connection(Arc<Shared>);

struct Shared {
    frames: mpsc::Sender<Bytes>,
    replies: Mutex<Replies>,
    /// `_INBOX.herald.<random>.`: each publish asks for its acknowledgement at this
    /// prefix and a number of its own.
    inbox: String,
    next: AtomicU64,
    /// The largest message (headers and body) the server takes.
    max_payload: usize,
}

#[derive(Default)]
struct Replies {
    waiting: HashMap<u64, oneshot::Sender<Reply>>,
    /// Why the connection ended, once it has: every later publish fails with it.
    closed: Option<(Failure, String)>,
}

/// A message on the inbox: the status of its header block (`NATS/1.0 503`), and its body.
struct Reply {
    status: Option<u16>,
    payload: Bytes,
}

/// What the server says of itself in `INFO`.
#[derive(Deserialize)]
struct Info {
    #[serde(default)]
    headers: bool,
    #[serde(default)]
    tls_required: bool,
    #[serde(default = "default_max_payload")]
    max_payload: usize,
}

fn default_max_payload() -> usize {
    1024 * 1024
}

/// Connects, signs in and subscribes to the acknowledgements' inbox, within the set-up
/// budget.
pub(super) async fn connect(
    dialer: &Dialer,
    address: &Address,
    credentials: &BrokerCredentials,
) -> Result<Connection, PublishError> {
    match tokio::time::timeout(dialer.budget, handshake(dialer, address, credentials)).await {
        Err(_) => Err(PublishError::new(Failure::Timeout, "the NATS handshake took too long", true)),
        Ok(made) => made,
    }
}

async fn handshake(
    dialer: &Dialer,
    address: &Address,
    credentials: &BrokerCredentials,
) -> Result<Connection, PublishError> {
    let mut plain = BufReader::new(dialer.tcp(address).await?);
    let info = read_info(&mut plain).await?;
    if !plain.buffer().is_empty() {
        return Err(protocol("the server sent more than INFO before CONNECT"));
    }
    let io: Box<dyn Io> = match (address.tls, info.tls_required) {
        (true, _) => dialer.tls(plain.into_inner(), address).await?,
        (false, true) => return Err(PublishError::new(Failure::Tls, "the NATS server requires TLS: use tls://", true)),
        (false, false) => Box::new(plain.into_inner()),
    };
    let (read, mut write) = tokio::io::split(io);
    let mut read = BufReader::new(read);
    write.write_all(&connect_frame(address.tls, credentials)).await.map_err(io_failure)?;
    write.flush().await.map_err(io_failure)?;
    await_pong(&mut read, &mut write).await?;
    if !info.headers {
        return Err(PublishError::new(
            Failure::BrokerRefused,
            "the NATS server does not take headers (NATS 2.2 or later is needed)",
            true,
        ));
    }
    let inbox = format!("_INBOX.herald.{:016x}.", rand::random::<u64>());
    write.write_all(format!("SUB {inbox}* 1\r\n").as_bytes()).await.map_err(io_failure)?;
    write.flush().await.map_err(io_failure)?;

    let (frames, queued) = mpsc::channel(QUEUED_FRAMES);
    let shared = Arc::new(Shared {
        frames,
        replies: Mutex::default(),
        inbox,
        next: AtomicU64::new(0),
        max_payload: info.max_payload,
    });
    tokio::spawn(write_frames(write, queued, Arc::downgrade(&shared)));
    tokio::spawn(read_frames(read, Arc::downgrade(&shared)));
    Ok(Connection(shared))
}

/// `CONNECT` with the credentials (a user and password, or a password alone as a token),
/// asking for headers and for "no responders" answers, then `PING`.
fn connect_frame(tls: bool, credentials: &BrokerCredentials) -> Vec<u8> {
    let mut options = serde_json::json!({
        "verbose": false, "pedantic": false, "tls_required": tls, "name": "herald", "lang": "rust",
        "version": env!("CARGO_PKG_VERSION"), "protocol": 1, "headers": true, "no_responders": true,
    });
    match (&credentials.username, &credentials.password) {
        (Some(user), password) => {
            options["user"] = user.as_str().into();
            options["pass"] = password.as_deref().unwrap_or_default().into();
        }
        (None, Some(token)) => options["auth_token"] = token.as_str().into(),
        (None, None) => {}
    }
    format!("CONNECT {options}\r\nPING\r\n").into_bytes()
}

async fn read_info<R: AsyncRead + Unpin>(read: &mut BufReader<R>) -> Result<Info, PublishError> {
    let line = read_line(read).await.map_err(io_failure)?;
    let json = line.strip_prefix("INFO ").ok_or_else(|| protocol("the server did not begin with INFO"))?;
    serde_json::from_str(json).map_err(|e| protocol(&format!("the server's INFO: {e}")))
}

/// Reads until the server's `PONG` (signed in) or `-ERR` (refused).
async fn await_pong<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    read: &mut BufReader<R>,
    write: &mut W,
) -> Result<(), PublishError> {
    loop {
        let line = read_line(read).await.map_err(io_failure)?;
        match line.split_once(' ').map_or(line.as_str(), |(verb, _)| verb) {
            "PONG" => return Ok(()),
            "PING" => write.write_all(b"PONG\r\n").await.map_err(io_failure)?,
            "-ERR" => return Err(server_error(&line)),
            _ => {}
        }
    }
}

impl Connection {
    /// Publishes `message` to `subject`: JetStream's acknowledgement, or why not.
    pub(super) async fn publish(&self, subject: &str, message: &Outbound) -> Result<Acknowledgement, PublishError> {
        let shared = &self.0;
        let token = shared.next.fetch_add(1, Ordering::Relaxed);
        let (frame, size) = hpub(subject, &format!("{}{token}", shared.inbox), message);
        if size > shared.max_payload {
            let why =
                format!("the message is {size} bytes with its headers, more than the server's {}", shared.max_payload);
            return Err(PublishError::new(Failure::MessageTooLarge, why, false));
        }
        let (answer, reply) = oneshot::channel();
        {
            let mut replies = shared.replies.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((failure, why)) = &replies.closed {
                return Err(PublishError::new(failure.clone(), why.clone(), true));
            }
            replies.waiting.insert(token, answer);
        }
        // However this future ends (answered, timed out, dropped), its place is freed.
        let _waiting = Waiting { shared, token };
        shared.frames.send(frame).await.map_err(|_| shared.closed())?;
        let reply = reply.await.map_err(|_| shared.closed())?;
        acknowledgement(subject, reply)
    }
}

/// A publish's place among the waiting ones, given up when the publish ends.
struct Waiting<'a> {
    shared: &'a Shared,
    token: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.shared.replies.lock().unwrap_or_else(|e| e.into_inner()).waiting.remove(&self.token);
    }
}

impl Shared {
    /// The error of a publish on a connection that has ended.
    fn closed(&self) -> PublishError {
        let replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        let (failure, why) =
            replies.closed.clone().unwrap_or((Failure::Connection, "the connection to NATS closed".into()));
        PublishError::new(failure, why, true)
    }
}

/// Ends the connection: waiting publishes and every later one fail with `why`.
fn close(shared: &Weak<Shared>, failure: Failure, why: String) {
    let Some(shared) = shared.upgrade() else { return };
    let mut replies = shared.replies.lock().unwrap_or_else(|e| e.into_inner());
    replies.closed.get_or_insert((failure, why));
    replies.waiting.clear();
}

/// `HPUB subject reply hdr total`, the header block and the body; and the size the server
/// counts against its `max_payload`.
fn hpub(subject: &str, reply: &str, message: &Outbound) -> (Bytes, usize) {
    let mut headers = BytesMut::with_capacity(256);
    headers.put_slice(b"NATS/1.0\r\n");
    for (name, value) in &message.headers {
        if value.contains(['\r', '\n']) {
            continue;
        }
        headers.put_slice(name.as_bytes());
        headers.put_slice(b": ");
        headers.put_slice(value.as_bytes());
        headers.put_slice(b"\r\n");
    }
    headers.put_slice(b"\r\n");
    let total = headers.len() + message.body.len();
    let mut frame = BytesMut::with_capacity(64 + subject.len() + reply.len() + total);
    frame.put_slice(format!("HPUB {subject} {reply} {} {total}\r\n", headers.len()).as_bytes());
    frame.put_slice(&headers);
    frame.put_slice(&message.body);
    frame.put_slice(b"\r\n");
    (frame.freeze(), total)
}

/// JetStream's answer as the attempt's result.
fn acknowledgement(subject: &str, reply: Reply) -> Result<Acknowledgement, PublishError> {
    if reply.status == Some(503) {
        let why = format!("no JetStream stream takes the subject {subject} (no responders)");
        return Err(PublishError::new(Failure::DestinationMissing, why, false));
    }
    #[derive(Deserialize)]
    struct PubAck {
        stream: Option<String>,
        seq: Option<u64>,
        #[serde(default)]
        duplicate: bool,
        error: Option<ApiError>,
    }
    #[derive(Deserialize)]
    struct ApiError {
        code: u16,
        #[serde(default)]
        err_code: u32,
        #[serde(default)]
        description: String,
    }
    let shown = String::from_utf8_lossy(&reply.payload[..reply.payload.len().min(512)]).into_owned();
    match serde_json::from_slice::<PubAck>(&reply.payload) {
        Ok(PubAck { error: Some(e), .. }) => {
            let why = format!("JetStream: {} (code {}, error {})", e.description, e.code, e.err_code);
            let failure = match (e.code, e.err_code) {
                // The message is larger than the stream's `max_msg_size`.
                (_, 10054) => Failure::MessageTooLarge,
                // Unavailable for now: no leader, a full stream that discards new, ….
                (503, _) => Failure::Throttled,
                _ => Failure::BrokerRefused,
            };
            Err(PublishError::new(failure, why, false))
        }
        Ok(PubAck { stream: Some(stream), seq: Some(seq), duplicate, .. }) => {
            Ok(format!("PUB {subject} stream {stream} seq {seq}{}", if duplicate { " duplicate" } else { "" }))
        }
        _ => Err(PublishError::new(
            Failure::BrokerRefused,
            format!("the answer on {subject} is not a JetStream acknowledgement: {shown}"),
            false,
        )),
    }
}

/// Writes queued frames in order, several to a flush; ends (shutting its side down, which
/// ends the reader too) when the connection's last handle is gone.
async fn write_frames<W: AsyncWrite + Unpin>(mut write: W, mut queued: mpsc::Receiver<Bytes>, shared: Weak<Shared>) {
    let mut batch = Vec::with_capacity(64);
    while queued.recv_many(&mut batch, 64).await > 0 {
        for frame in batch.drain(..) {
            if let Err(e) = write.write_all(&frame).await {
                return close(&shared, Failure::Connection, format!("writing to NATS: {e}"));
            }
        }
        if let Err(e) = write.flush().await {
            return close(&shared, Failure::Connection, format!("writing to NATS: {e}"));
        }
    }
    let _ = write.shutdown().await;
}

/// Reads what the server sends: acknowledgements to their publishes, `PING`s answered,
/// `-ERR` ending the connection.
async fn read_frames<R: AsyncRead + Unpin>(mut read: BufReader<R>, shared: Weak<Shared>) {
    let (failure, why) = loop {
        match read_frame(&mut read, &shared).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(ended) => break ended,
        }
    };
    close(&shared, failure, why);
}

/// One frame; `false` once the connection's handles are all gone.
async fn read_frame<R: AsyncRead + Unpin>(
    read: &mut BufReader<R>,
    shared: &Weak<Shared>,
) -> Result<bool, (Failure, String)> {
    let line = read_line(read).await.map_err(|e| (Failure::Connection, format!("reading from NATS: {e}")))?;
    let mut words = line.split_ascii_whitespace();
    let Some(shared) = shared.upgrade() else { return Ok(false) };
    let (subject, header_len, total) = match words.next().unwrap_or_default() {
        "MSG" => {
            let parts: Vec<&str> = words.collect();
            (parts.first().copied(), Some("0"), parts.last().copied())
        }
        "HMSG" => {
            let parts: Vec<&str> = words.collect();
            let n = parts.len();
            (parts.first().copied(), parts.get(n.wrapping_sub(2)).copied(), parts.last().copied())
        }
        "PING" => {
            let _ = shared.frames.try_send(Bytes::from_static(b"PONG\r\n"));
            return Ok(true);
        }
        "-ERR" => {
            let e = server_error(&line);
            return Err((e.failure, e.why));
        }
        "PONG" | "+OK" | "INFO" => return Ok(true),
        _ => return Err((Failure::BrokerRefused, format!("NATS sent an unknown line: {:.80}", line))),
    };
    let size = |n: Option<&str>| n.and_then(|n| n.parse::<usize>().ok());
    let (Some(subject), Some(header_len), Some(total)) = (subject, size(header_len), size(total)) else {
        return Err((Failure::BrokerRefused, format!("NATS sent a malformed message line: {:.80}", line)));
    };
    if total > MAX_REPLY || header_len > total {
        return Err((Failure::BrokerRefused, format!("NATS sent a {total}-byte reply; acknowledgements are small")));
    }
    let mut body = vec![0; total + 2];
    read.read_exact(&mut body).await.map_err(|e| (Failure::Connection, format!("reading from NATS: {e}")))?;
    body.truncate(total);
    let status = std::str::from_utf8(&body[..header_len])
        .ok()
        .and_then(|h| h.lines().next()?.strip_prefix("NATS/1.0 ")?.get(..3)?.parse().ok());
    let payload = Bytes::from(body).slice(header_len..);
    let token = subject.strip_prefix(shared.inbox.as_str()).and_then(|t| t.parse::<u64>().ok());
    let waiting = token.and_then(|t| shared.replies.lock().unwrap_or_else(|e| e.into_inner()).waiting.remove(&t));
    if let Some(waiting) = waiting {
        let _ = waiting.send(Reply { status, payload });
    }
    Ok(true)
}

/// One protocol line without its `\r\n`, refusing lines longer than `MAX_LINE`.
async fn read_line<R: AsyncRead + Unpin>(read: &mut BufReader<R>) -> std::io::Result<String> {
    let mut line = Vec::new();
    let n = (&mut *read).take(MAX_LINE as u64).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    if line.last() != Some(&b'\n') {
        return Err(std::io::Error::other(format!("a line longer than {MAX_LINE} bytes")));
    }
    let line = String::from_utf8(line).map_err(|_| std::io::Error::other("a line that is not UTF-8"))?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

/// The server's `-ERR '…'` in Herald's classes; the server closes the connection after
/// most, and Herald makes a new one after any.
fn server_error(line: &str) -> PublishError {
    let said = line.trim_start_matches("-ERR").trim().trim_matches('\'');
    let lower = said.to_ascii_lowercase();
    let failure = if lower.contains("authorization") || lower.contains("authentication") || lower.contains("permission")
    {
        Failure::BrokerAuth
    } else if lower.contains("maximum payload") {
        Failure::MessageTooLarge
    } else {
        Failure::BrokerRefused
    };
    PublishError::new(failure, format!("NATS: {said}"), true)
}

fn io_failure(e: std::io::Error) -> PublishError {
    PublishError::new(Failure::Connection, format!("NATS: {e}"), true)
}

fn protocol(why: &str) -> PublishError {
    PublishError::new(Failure::BrokerRefused, format!("NATS: {why}"), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: Option<u16>, payload: &str) -> Reply {
        Reply { status, payload: Bytes::copy_from_slice(payload.as_bytes()) }
    }

    #[test]
    fn a_publish_frame_counts_its_headers_and_body() {
        let message = Outbound {
            body: Bytes::from_static(b"{}"),
            headers: vec![("webhook-id".into(), "msg_1".into()), ("bad".into(), "a\r\nb".into())],
        };
        let (frame, size) = hpub("orders.paid", "_INBOX.x.7", &message);
        let headers = "NATS/1.0\r\nwebhook-id: msg_1\r\n\r\n";
        let expected =
            format!("HPUB orders.paid _INBOX.x.7 {} {}\r\n{headers}{{}}\r\n", headers.len(), headers.len() + 2);
        assert_eq!(std::str::from_utf8(&frame).unwrap(), expected);
        assert_eq!(size, headers.len() + 2);
    }

    #[tokio::test]
    async fn a_broker_cannot_make_herald_read_an_endless_line_or_a_huge_reply() {
        let endless = vec![b'x'; MAX_LINE + 10];
        assert!(read_line(&mut BufReader::new(&endless[..])).await.is_err(), "a line past MAX_LINE is refused");
        let huge = format!("MSG _INBOX.x.1 1 {}\r\n", MAX_REPLY + 1);
        let (frames, _queued) = mpsc::channel(1);
        let shared = Arc::new(Shared {
            frames,
            replies: Mutex::default(),
            inbox: "_INBOX.x.".into(),
            next: AtomicU64::new(0),
            max_payload: 1024,
        });
        let read = read_frame(&mut BufReader::new(huge.as_bytes()), &Arc::downgrade(&shared)).await;
        let (failure, why) = read.expect_err("refused before reading it");
        assert_eq!(failure, Failure::BrokerRefused, "{why}");
    }

    #[test]
    fn jetstream_answers_are_classified() {
        let ok = acknowledgement("o", reply(None, r#"{"stream":"ORDERS","seq":42}"#));
        assert_eq!(ok.ok().as_deref(), Some("PUB o stream ORDERS seq 42"));
        let class = |r| acknowledgement("o", r).err().map(|e| e.failure);
        assert_eq!(class(reply(Some(503), "")), Some(Failure::DestinationMissing));
        let too_large =
            r#"{"error":{"code":400,"err_code":10054,"description":"message size exceeds maximum allowed"}}"#;
        assert_eq!(class(reply(None, too_large)), Some(Failure::MessageTooLarge));
        assert_eq!(class(reply(None, r#"{"error":{"code":503,"description":"no leader"}}"#)), Some(Failure::Throttled));
        assert_eq!(class(reply(None, "pong")), Some(Failure::BrokerRefused));
        assert_eq!(server_error("-ERR 'Authorization Violation'").failure, Failure::BrokerAuth);
    }
}
