//! An endpoint's event destination as the API sets it: kept, replaced or removed, checked
//! by the destination guard, sealed with its credentials, and reflected in `url`, which
//! reads back as the broker's URL (`destinations::Destination::read_back_url`) so the Svix
//! SDKs keep working.

use super::rules::normalized_url;
use crate::api::AppState;
use crate::api::error::{ApiError, ApiResult};
use crate::api::validate::Problems;
use crate::destinations::{Destination, DestinationOut};
use crate::store::Endpoint;

/// Sets `e`'s destination and URL from a request: `given` `None` keeps the stored
/// destination, `Some(None)` removes it, `Some(Some(d))` sets `d` (what it leaves out of
/// its credentials kept from the stored one, if the broker is the same: credentials never
/// follow a destination to another broker). `url` is the URL the request sent, if any: with a
/// destination it may only repeat the read-back URL.
pub(super) fn apply(
    state: &AppState,
    e: &mut Endpoint,
    given: Option<Option<Destination>>,
    url: Option<String>,
) -> ApiResult<()> {
    let keyring = state.catalog.keyring();
    let stored = match keyring.open_destination(&e.destination, &e.id) {
        Ok(stored) => stored,
        // What cannot be read can still be replaced or removed as a whole.
        Err(_) if matches!(&given, Some(None)) || matches!(&given, Some(Some(d)) if d.credentials.is_some()) => None,
        Err(err) => {
            tracing::error!(endpoint = %e.id, error = %err, "the endpoint's destination does not open");
            return Err(ApiError::Conflict(
                "the endpoint's destination cannot be read with the configured server key; give it whole, \
                 credentials included (or null), to replace it"
                    .into(),
            ));
        }
    };
    let destination = match given {
        None => stored,
        Some(None) => None,
        Some(Some(d)) => {
            let mut d = d.with_defaults();
            keep_credentials(&mut d, stored);
            Some(d)
        }
    };
    let Some(destination) = destination else {
        if let Some(url) = url {
            e.url = normalized_url(state, url);
        }
        e.destination = Default::default();
        return Ok(());
    };
    let mut p = Problems::default();
    for (field, why) in destination.problems(&state.guard) {
        p.push(&field, why);
    }
    let read_back = destination.read_back_url();
    if let Some(url) = url.filter(|u| !u.is_empty() && *u != read_back) {
        p.push(
            "url",
            format!(
                "this endpoint publishes to {read_back}: leave url out, or set destination to null to deliver to {url} over HTTP"
            ),
        );
    }
    p.finish()?;
    e.url = read_back;
    e.destination = keyring.seal_destination(Some(&destination), &e.id);
    Ok(())
}

/// What an update leaves out of the credentials is kept from the stored destination, on
/// the same broker and type only: all of them when `credentials` is left out, the
/// password when only the same username is given (as a read shows it).
fn keep_credentials(d: &mut Destination, stored: Option<Destination>) {
    let Some(stored) = stored.filter(|s| s.broker == d.broker && s.kind.name() == d.kind.name()) else { return };
    match &mut d.credentials {
        None => d.credentials = stored.credentials,
        Some(given) if given.password.is_none() => {
            let same_user = stored.credentials.as_ref().filter(|s| s.username == given.username);
            given.password = same_user.and_then(|s| s.password.clone());
        }
        Some(_) => {}
    }
}

/// The destination as reads show it (no secrets); `None` for an HTTP endpoint or one
/// whose destination the server key cannot open (logged).
pub fn shown(state: &AppState, e: &Endpoint) -> Option<DestinationOut> {
    match state.catalog.keyring().open_destination(&e.destination, &e.id) {
        Ok(destination) => destination.map(|d| d.shown()),
        Err(err) => {
            tracing::error!(endpoint = %e.id, error = %err, "the endpoint's destination does not open");
            None
        }
    }
}
