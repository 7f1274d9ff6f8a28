//! Sealing again, under the current server key, what was sealed under a previous one.

use super::Catalog;
use crate::store::{App, AppProxy, Endpoint, PageQuery, StoreResult};

impl Catalog {
    /// Seals again, under the current server key, every endpoint secret and header set
    /// sealed under a previous one (so the old key can be dropped from the configuration),
    /// and seals headers written before they were sealed at all. Returns how many endpoints
    /// were rewritten.
    pub async fn reseal_stale(&self) -> StoreResult<usize> {
        let mut page = PageQuery { limit: 100, iterator: None, descending: false };
        let mut resealed = 0;
        loop {
            let apps = self.store.list_apps(&page).await?;
            // A row written meanwhile was sealed under the current key by its writer: a
            // lost race leaves nothing to do.
            for app in &apps {
                if let Some(mut fresh) = self.resealed_app(app) {
                    fresh.updated_at = app.updated_at + 1;
                    if self.store.update_app(&fresh, app.updated_at).await? {
                        self.invalidate_app(&fresh);
                        resealed += 1;
                    }
                }
                for endpoint in self.store.app_endpoints(&app.id).await? {
                    let read_at = endpoint.updated_at;
                    if let Some(mut fresh) = self.resealed(endpoint) {
                        fresh.updated_at = read_at + 1;
                        if self.store.update_endpoint(&fresh, read_at).await? {
                            self.invalidate_endpoint(&fresh.app_id, &fresh.id);
                            resealed += 1;
                        }
                    }
                }
            }
            match apps.last() {
                Some(last) if apps.len() == page.limit => page.iterator = Some(last.id.to_string()),
                _ => return Ok(resealed),
            }
        }
    }

    /// The application with its proxy's credentials sealed under the current key, if they
    /// were not (and open).
    fn resealed_app(&self, app: &App) -> Option<App> {
        let proxy = app.proxy.as_ref().filter(|p| !p.credentials.0.is_empty())?;
        if !self.keyring.is_stale(&proxy.credentials.0) {
            return None;
        }
        match self.keyring.open_proxy_credentials(&proxy.credentials, app.id.as_str()) {
            Ok(credentials) => {
                let credentials = self.keyring.seal_proxy_credentials(&credentials, app.id.as_str());
                Some(App { proxy: Some(AppProxy { credentials, ..proxy.clone() }), ..app.clone() })
            }
            Err(e) => {
                tracing::error!(app = %app.id, error = %e, "cannot seal an application's proxy credentials again");
                None
            }
        }
    }

    /// The endpoint with its secrets, headers, credentials and destination sealed under the
    /// current key, if any was not (and all open).
    fn resealed(&self, mut endpoint: Endpoint) -> Option<Endpoint> {
        let keyring = &self.keyring;
        let stale_headers = endpoint.headers.is_plaintext()
            || (!endpoint.headers.0.is_empty() && keyring.is_stale(&endpoint.headers.0));
        let stale_auth = !endpoint.auth.0.is_empty() && keyring.is_stale(&endpoint.auth.0);
        let stale_destination = !endpoint.destination.0.is_empty() && keyring.is_stale(&endpoint.destination.0);
        if !keyring.is_stale(&endpoint.secrets.0) && !stale_headers && !stale_auth && !stale_destination {
            return None;
        }
        let opened = keyring.open_secrets(&endpoint.secrets, &endpoint.id).and_then(|secrets| {
            let headers = keyring.open_headers(&endpoint.headers, &endpoint.id)?;
            let credentials = keyring.open_credentials(&endpoint.auth, &endpoint.id)?;
            let destination = keyring.open_destination(&endpoint.destination, &endpoint.id)?;
            Ok((secrets, headers, credentials, destination))
        });
        match opened {
            Ok((secrets, headers, credentials, destination)) => {
                endpoint.secrets = keyring.seal_secrets(&secrets, &endpoint.id);
                endpoint.headers = keyring.seal_headers(&headers, &endpoint.id);
                endpoint.auth = keyring.seal_credentials(&credentials, &endpoint.id);
                endpoint.destination = keyring.seal_destination(destination.as_ref(), &endpoint.id);
                Some(endpoint)
            }
            Err(e) => {
                tracing::error!(endpoint = %endpoint.id, error = %e, "cannot seal an endpoint's secrets again");
                None
            }
        }
    }
}
