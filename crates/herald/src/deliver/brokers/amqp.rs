//! RabbitMQ (AMQP 0-9-1). One connection and one channel in confirm mode per destination
//! identity; each message is published persistent (`delivery-mode 2`) and mandatory, with
//! the headers as AMQP headers, and delivered once the broker confirms it (`basic.ack`):
//! a persistent message routed to a durable queue is then on disk, or on a quorum of nodes
//! for a quorum queue. A message no queue takes comes back (`basic.return`, 312 NO_ROUTE)
//! and a missing exchange closes the channel (404 NOT_FOUND): both `destination_missing`.
//!
//! lapin speaks the protocol over the stream Herald opens through the destination guard
//! (`Connection::connector` calls back for it); lapin runs each connection's IO on a thread
//! of its own.

use std::sync::{Arc, Mutex};

use async_compat::Compat;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::{AMQPAuthority, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{BasicProperties, Channel, Confirmation, ConnectionProperties, ErrorKind};

use super::{Acknowledgement, Dialer, Outbound, PublishError};
use crate::destinations::{Address, BrokerCredentials};
use crate::outcome::Failure;

/// A connection and its confirming channel; closed when the last handle goes.
#[derive(Clone)]
pub(super) struct Connection(Arc<Open>);

struct Open {
    connection: Option<lapin::Connection>,
    channel: Channel,
}

impl Drop for Open {
    fn drop(&mut self) {
        if let (Some(connection), Ok(runtime)) = (self.connection.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move { connection.close(200, "Herald is done with it".into()).await });
        }
    }
}

/// Signs in to `vhost` (as `guest` without credentials, AMQP's default) and opens a
/// channel in confirm mode, within the set-up budget.
pub(super) async fn connect(
    dialer: &Dialer,
    address: &Address,
    credentials: &BrokerCredentials,
    vhost: String,
) -> Result<Connection, PublishError> {
    let userinfo = AMQPUserInfo {
        username: credentials.username.clone().unwrap_or_else(|| "guest".into()),
        password: credentials.password.clone().unwrap_or_else(|| "guest".into()),
    };
    let uri = AMQPUri {
        scheme: if address.tls { AMQPScheme::AMQPS } else { AMQPScheme::AMQP },
        authority: AMQPAuthority { userinfo, host: address.host.clone(), port: address.port },
        vhost,
        query: Default::default(),
    };
    // Why the last dial failed, in Herald's classes (lapin sees only an IO error).
    let dial_failure = Arc::new(Mutex::new(None));
    let dial = {
        let (dialer, address, dial_failure) = (dialer.clone(), address.clone(), dial_failure.clone());
        async move |_: AMQPUri, _| match stream(&dialer, &address).await {
            Ok(stream) => Ok(stream),
            Err(e) => {
                let io = std::io::Error::other(e.why.clone());
                *dial_failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                Err(io.into())
            }
        }
    };
    let open = async {
        let runtime = lapin::runtime::default_runtime().map_err(|e| refused_connection(&e))?;
        let connection =
            lapin::Connection::connector(uri, runtime, dial, ConnectionProperties::default()).await.map_err(|e| {
                dial_failure.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_else(|| refused_connection(&e))
            })?;
        let channel = connection.create_channel().await.map_err(|e| refused_connection(&e))?;
        channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(|e| refused_connection(&e))?;
        Ok(Connection(Arc::new(Open { connection: Some(connection), channel })))
    };
    match tokio::time::timeout(dialer.budget, open).await {
        Err(_) => Err(PublishError::new(Failure::Timeout, "the AMQP handshake took too long", true)),
        Ok(made) => made,
    }
}

/// The guarded TCP connection, with TLS over it for `amqps`, as lapin takes it.
async fn stream(
    dialer: &Dialer,
    address: &Address,
) -> Result<AsyncTcpStream<Compat<tokio::net::TcpStream>>, PublishError> {
    let plain = AsyncTcpStream::Plain(Compat::new(dialer.tcp(address).await?));
    if !address.tls {
        return Ok(plain);
    }
    let config = dialer.tls.clone().ok_or_else(|| PublishError::new(Failure::Tls, "no TLS settings", true))?;
    let connector = RustlsConnector::from(config);
    let handshake = plain.into_rustls(&connector, &address.host);
    match tokio::time::timeout(dialer.budget, handshake).await {
        Err(_) => Err(PublishError::new(Failure::Timeout, "the TLS handshake took too long", true)),
        Ok(Err(e)) => Err(PublishError::new(Failure::Tls, format!("TLS with the broker: {e}"), true)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

impl Connection {
    /// Publishes `message` to `exchange` with `routing_key`: the broker's confirmation, or
    /// why not.
    pub(super) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        message: &Outbound,
    ) -> Result<Acknowledgement, PublishError> {
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
        }
        let id = message.headers.iter().find(|(name, _)| name == "webhook-id").map(|(_, id)| id.as_str());
        let mut properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = id {
            properties = properties.with_message_id(id.into());
        }
        let options = BasicPublishOptions { mandatory: true, ..Default::default() };
        let channel = &self.0.channel;
        let blame = |e: lapin::Error| blame(classify(&e), exchange, message.body.len());
        let confirm = channel
            .basic_publish(exchange.into(), routing_key.into(), options, &message.body, properties)
            .await
            .map_err(blame)?;
        let place =
            if exchange.is_empty() { "the default exchange".to_owned() } else { format!("exchange {exchange}") };
        match confirm.await.map_err(blame)? {
            Confirmation::Ack(None) => Ok(format!("basic.ack from {place}, routing key {routing_key}")),
            Confirmation::Ack(Some(returned)) => Err(PublishError::new(
                Failure::DestinationMissing,
                format!(
                    "no queue takes routing key {routing_key} on {place} ({} {})",
                    returned.reply_code, returned.reply_text
                ),
                false,
            )),
            // A queue that refuses what overflows it (`reject-publish`), or a broker
            // failing to store: not now.
            Confirmation::Nack(_) => Err(PublishError::new(
                Failure::Throttled,
                format!("the broker did not take the message (basic.nack from {place})"),
                false,
            )),
            Confirmation::NotRequested => {
                Err(PublishError::new(Failure::Internal, "the channel is not in confirm mode", true))
            }
        }
    }
}

/// Why a connection could not be made: refused credentials and a virtual host that does
/// not exist are the customer's to fix; anything else (a virtual host still recovering
/// after a restart, "vhost / is down", a broker shutting down) is the broker not being
/// there yet, and retried.
fn refused_connection(e: &lapin::Error) -> PublishError {
    let mut refused = classify(e);
    let missing_vhost = refused.why.contains("NOT_ALLOWED") && refused.why.contains("not found");
    refused.failure = match refused.failure {
        Failure::BrokerAuth => Failure::BrokerAuth,
        _ if missing_vhost => Failure::DestinationMissing,
        _ => Failure::Connection,
    };
    refused
}

/// A refusal closes the channel every publish of the connection shares, so each one in
/// flight gets it: a missing exchange or an oversized message is this publish's own
/// permanent failure only if the broker's words name this exchange or this size; any
/// other publish lost its channel, and is retried.
fn blame(mut e: PublishError, exchange: &str, size: usize) -> PublishError {
    let ours = match e.failure {
        Failure::DestinationMissing => e.why.contains(&format!("no exchange '{exchange}'")),
        Failure::MessageTooLarge => e.why.contains(&format!("message size {size} ")),
        _ => true,
    };
    if !ours {
        e.failure = Failure::Connection;
        e.why = format!("{} (another message's refusal closed the shared channel)", e.why);
    }
    e
}

/// lapin's errors in Herald's classes. A channel-level refusal closes the channel, so
/// every error but a refused message makes a new connection.
fn classify(e: &lapin::Error) -> PublishError {
    let why = format!("RabbitMQ: {e}");
    let failure = match e.kind() {
        ErrorKind::ProtocolError(amqp) => match (amqp.get_id(), amqp.kind()) {
            (403, _) => Failure::BrokerAuth,
            (404, _) => Failure::DestinationMissing,
            (406, _) if amqp.get_message().as_str().contains("larger than") => Failure::MessageTooLarge,
            (320 | 505 | 506 | 541, _) => Failure::Connection,
            _ => Failure::BrokerRefused,
        },
        ErrorKind::MissingHeartbeatError => Failure::Timeout,
        _ => Failure::Connection,
    };
    PublishError::new(failure, why, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_blamed_on_the_publish_it_names() {
        let missing =
            || PublishError::new(Failure::DestinationMissing, "NOT_FOUND - no exchange 'audit' in vhost '/'", true);
        assert_eq!(blame(missing(), "audit", 10).failure, Failure::DestinationMissing);
        assert_eq!(blame(missing(), "orders", 10).failure, Failure::Connection);
        let large = || {
            PublishError::new(Failure::MessageTooLarge, "message size 900 is larger than configured max size 512", true)
        };
        assert_eq!(blame(large(), "", 900).failure, Failure::MessageTooLarge);
        assert_eq!(blame(large(), "", 30).failure, Failure::Connection);
    }
}
