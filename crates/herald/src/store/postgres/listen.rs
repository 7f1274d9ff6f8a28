//! LISTEN/NOTIFY: one dedicated connection per process hears `herald_work` (claimable work
//! appeared) and `herald_catalog` (an application or endpoint changed) and turns them into
//! [`Signals`]. Notifications are only wake-ups, never data: after a reconnect everything is
//! re-read (the catalog is flushed and the loader woken), so a lost notification costs at
//! most one poll interval.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{CatalogChange, Signals};
use crate::supervisor::{Liveness, spawn_task};

pub fn start(config: tokio_postgres::Config, signals: Signals, liveness: &Arc<Liveness>) {
    let live = liveness.clone();
    spawn_task(liveness, "the notification listener", async move {
        let mut delay = Duration::from_millis(200);
        loop {
            match listen(&config, &signals, &live).await {
                Ok(()) => delay = Duration::from_millis(200),
                Err(e) => {
                    tracing::warn!(error = %e, "notification listener lost its connection; reconnecting");
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
            tokio::time::sleep(delay).await;
        }
    });
}

async fn listen(
    config: &tokio_postgres::Config,
    signals: &Signals,
    live: &Arc<Liveness>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Polling the connection both drives the client's queries and yields notifications.
    let pump = spawn_task(live, "the notification connection", async move {
        let mut messages = std::pin::pin!(futures_util::stream::poll_fn(move |cx| connection.poll_message(cx)));
        while let Some(message) = messages.next().await {
            if tx.send(message).is_err() {
                break;
            }
        }
    });
    client.batch_execute("LISTEN herald_work; LISTEN herald_catalog").await?;
    // Anything may have happened while we were not listening.
    let _ = signals.catalog.send(CatalogChange::All);
    signals.work.notify_waiters();
    while let Some(message) = rx.recv().await {
        match message {
            Ok(AsyncMessage::Notification(n)) if n.channel() == "herald_work" => signals.work.notify_waiters(),
            Ok(AsyncMessage::Notification(n)) if n.channel() == "herald_catalog" => {
                let _ = signals.catalog.send(parse_change(n.payload()));
            }
            Ok(_) => {}
            Err(e) => {
                pump.abort();
                return Err(e);
            }
        }
    }
    pump.abort();
    Ok(())
}

/// Reads `app:{app}`, `endpoint:{app}:{endpoint}`, `retry:{app}:{endpoint}` or
/// `resend:{app}:{endpoint}:{msg}`; anything else flushes everything.
fn parse_change(payload: &str) -> CatalogChange {
    let mut parts = payload.split(':');
    let fields = (parts.next(), parts.next(), parts.next());
    if let ((Some("resend"), Some(app), Some(endpoint)), Some(msg)) = (fields, parts.next()) {
        let app = AppId::from_trusted(app.to_owned());
        return CatalogChange::Resend(
            app,
            EndpointId::from_trusted(endpoint.to_owned()),
            MessageId::from_trusted(msg.to_owned()),
        );
    }
    match fields {
        (Some("app"), Some(app), None) => CatalogChange::App(AppId::from_trusted(app.to_owned())),
        (Some("endpoint"), Some(app), Some(endpoint)) => {
            CatalogChange::Endpoint(AppId::from_trusted(app.to_owned()), EndpointId::from_trusted(endpoint.to_owned()))
        }
        (Some("retry"), Some(app), Some(endpoint)) => {
            CatalogChange::RetryNow(AppId::from_trusted(app.to_owned()), EndpointId::from_trusted(endpoint.to_owned()))
        }
        _ => CatalogChange::All,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_announcements_parse_back() {
        assert_eq!(parse_change("app:app_1"), CatalogChange::App(AppId::from_trusted("app_1".into())));
        assert_eq!(
            parse_change("endpoint:app_1:ep_2"),
            CatalogChange::Endpoint(AppId::from_trusted("app_1".into()), EndpointId::from_trusted("ep_2".into()))
        );
        assert_eq!(parse_change("garbage"), CatalogChange::All);
        assert_eq!(
            parse_change("resend:app_1:ep_2:msg_3"),
            CatalogChange::Resend(
                AppId::from_trusted("app_1".into()),
                EndpointId::from_trusted("ep_2".into()),
                MessageId::from_trusted("msg_3".into())
            )
        );
    }
}
