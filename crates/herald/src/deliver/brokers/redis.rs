//! Redis Streams: one `XADD` per message, fields `body` and then each header
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`, `herald-event-type`, …).
//! Delivered once Redis answers with the entry's id. How durable that is, is Redis's own
//! persistence setting: with `appendonly yes` and `appendfsync always` the entry is on disk
//! when the id comes back; with the default `everysec` up to a second of entries can be
//! lost if the Redis host fails (not if only Redis restarts); without persistence, a
//! restart loses the stream (README, *Event destinations*).
//!
//! The `redis` crate speaks the protocol over a stream Herald opened through the
//! destination guard (`MultiplexedConnection::new_with_config`); its multiplexed handle
//! pipelines concurrent attempts on one connection.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisConnectionInfo, RedisError};

use super::{Acknowledgement, Dialer, Outbound, PublishError};
use crate::destinations::{Address, BrokerCredentials};
use crate::outcome::Failure;

pub(super) type Connection = MultiplexedConnection;

/// How long Redis may take to answer one command once connected.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) async fn connect(
    dialer: &Dialer,
    address: &Address,
    credentials: &BrokerCredentials,
    db: i64,
) -> Result<Connection, PublishError> {
    let stream = dialer.stream(address).await?;
    let mut info = RedisConnectionInfo::default().set_db(db).set_skip_set_lib_name();
    if let Some(username) = &credentials.username {
        info = info.set_username(username);
    }
    if let Some(password) = &credentials.password {
        info = info.set_password(password);
    }
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(RESPONSE_TIMEOUT));
    let handshake = MultiplexedConnection::new_with_config(&info, stream, config);
    let (connection, driver) = match tokio::time::timeout(dialer.budget, handshake).await {
        Err(_) => return Err(PublishError::new(Failure::Timeout, "the Redis handshake took too long", true)),
        Ok(Err(e)) => return Err(classify(&e)),
        Ok(Ok(made)) => made,
    };
    tokio::spawn(driver);
    Ok(connection)
}

/// `XADD stream [NOMKSTREAM] [MAXLEN ~ n] * body … headers …`: the entry id, or why not.
pub(super) async fn publish(
    mut connection: Connection,
    stream: &str,
    create_stream: bool,
    max_len: Option<u64>,
    message: &Outbound,
) -> Result<Acknowledgement, PublishError> {
    let mut xadd = redis::cmd("XADD");
    xadd.arg(stream);
    if !create_stream {
        xadd.arg("NOMKSTREAM");
    }
    if let Some(max_len) = max_len {
        xadd.arg("MAXLEN").arg("~").arg(max_len);
    }
    xadd.arg("*").arg("body").arg(&message.body[..]);
    for (name, value) in &message.headers {
        xadd.arg(name).arg(value);
    }
    match xadd.query_async::<Option<String>>(&mut connection).await {
        Ok(Some(id)) => Ok(format!("XADD {stream} {id}")),
        Ok(None) => Err(PublishError::new(
            Failure::DestinationMissing,
            format!("the stream {stream} does not exist (set createStream to create it)"),
            false,
        )),
        Err(e) => Err(classify(&e)),
    }
}

/// Redis's errors in Herald's classes; a broken connection is made again.
fn classify(e: &RedisError) -> PublishError {
    let code = e.code().unwrap_or_default();
    let why = format!("Redis: {e}");
    if matches!(e.kind(), ErrorKind::AuthenticationFailed) || matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM") {
        return PublishError::new(Failure::BrokerAuth, why, true);
    }
    if e.is_timeout() {
        return PublishError::new(Failure::Timeout, why, true);
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return PublishError::new(Failure::Connection, why, true);
    }
    match code {
        // Out of memory (`maxmemory`), loading, busy with a script, or a read-only replica:
        // the broker cannot take the message now.
        "OOM" | "LOADING" | "BUSY" | "READONLY" | "MASTERDOWN" | "TRYAGAIN" => {
            PublishError::new(Failure::Throttled, why, false)
        }
        _ => PublishError::new(Failure::BrokerRefused, why, false),
    }
}
