//! The in-memory view of applications and endpoints that ingest and delivery read on every
//! message: routing (which endpoints a message goes to) and ready-to-use delivery targets
//! (parsed URL, decoded signing keys, resolved settings). Nothing on the hot path reads
//! endpoint settings from the database; API writes invalidate what they change.
//!
//! `target.rs` is what an endpoint becomes for delivery, `reseal.rs` the pass that seals
//! secrets again under a new server key; this file is the cache and its invalidation.

mod reseal;
mod target;

pub use target::{AppLimits, DEFAULT_MAX_CONCURRENCY, Target, routes_to};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::egress::EgressProxy;
use crate::endpoint_settings::Defaults;
use crate::ids::{AppId, EndpointId};
use crate::sealing::Keyring;
use crate::store::{App, CatalogChange, CatalogStore, StoreResult};

pub struct Catalog {
    store: Arc<dyn CatalogStore>,
    defaults: Defaults,
    keyring: Arc<Keyring>,
    /// Bumped by every invalidation, so a load that raced with a change is not cached.
    generation: AtomicU64,
    apps: RwLock<HashMap<String, Arc<App>>>,
    routes: RwLock<HashMap<AppId, Arc<[Arc<Target>]>>>,
    targets: RwLock<HashMap<EndpointId, Arc<Target>>>,
}

impl Catalog {
    pub fn new(store: Arc<dyn CatalogStore>, defaults: Defaults, keyring: Arc<Keyring>) -> Self {
        Self {
            store,
            defaults,
            keyring,
            generation: AtomicU64::new(0),
            apps: RwLock::default(),
            routes: RwLock::default(),
            targets: RwLock::default(),
        }
    }

    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// The server key that seals endpoint secrets.
    pub fn keyring(&self) -> &Keyring {
        &self.keyring
    }

    /// An application by id or uid.
    pub async fn app(&self, id_or_uid: &str) -> StoreResult<Option<Arc<App>>> {
        if let Some(app) = read(&self.apps).get(id_or_uid) {
            return Ok(Some(app.clone()));
        }
        let generation = self.generation.load(Ordering::Acquire);
        let Some(app) = self.store.app(id_or_uid).await? else {
            return Ok(None);
        };
        let app = Arc::new(app);
        if self.generation.load(Ordering::Acquire) == generation {
            let mut apps = write(&self.apps);
            apps.insert(app.id.to_string(), app.clone());
            if let Some(uid) = &app.uid {
                apps.insert(uid.clone(), app.clone());
            }
        }
        Ok(Some(app))
    }

    /// Every endpoint of an application, prepared for delivery.
    pub async fn targets_of(&self, app: &AppId) -> StoreResult<Arc<[Arc<Target>]>> {
        if let Some(found) = read(&self.routes).get(app) {
            return Ok(found.clone());
        }
        let generation = self.generation.load(Ordering::Acquire);
        let (limits, proxy) = self.limits(app).await?;
        let endpoints = self.store.app_endpoints(app).await?;
        let prepare = |e| Arc::new(Target::new(e, limits, &self.defaults, &self.keyring).with_proxy(proxy.clone()));
        let targets: Arc<[Arc<Target>]> = endpoints.into_iter().map(prepare).collect();
        if self.generation.load(Ordering::Acquire) == generation {
            write(&self.routes).insert(app.clone(), targets.clone());
            let mut by_id = write(&self.targets);
            for target in targets.iter() {
                by_id.insert(target.endpoint.id.clone(), target.clone());
            }
        }
        Ok(targets)
    }

    /// One endpoint, prepared for delivery.
    pub async fn target(&self, id: &EndpointId) -> StoreResult<Option<Arc<Target>>> {
        if let Some(found) = read(&self.targets).get(id) {
            return Ok(Some(found.clone()));
        }
        let generation = self.generation.load(Ordering::Acquire);
        let Some(endpoint) = self.store.endpoint_by_id(id).await? else {
            return Ok(None);
        };
        let (limits, proxy) = self.limits(&endpoint.app_id).await?;
        let target = Arc::new(Target::new(endpoint, limits, &self.defaults, &self.keyring).with_proxy(proxy));
        if self.generation.load(Ordering::Acquire) == generation {
            write(&self.targets).insert(id.clone(), target.clone());
        }
        Ok(Some(target))
    }

    /// What the dispatcher needs of an application: its limits, and its own egress proxy
    /// (its credentials opened; `None`: the server's).
    async fn limits(&self, app: &AppId) -> StoreResult<(AppLimits, Option<EgressProxy>)> {
        let Some(app) = self.app(app.as_str()).await? else { return Ok(Default::default()) };
        let proxy = app.proxy.as_ref().and_then(|p| {
            let opened = self.keyring.open_proxy_credentials(&p.credentials, app.id.as_str());
            let opened = opened.inspect_err(|e| {
                tracing::error!(app = %app.id, error = %e, "the application's proxy credentials do not open");
            });
            EgressProxy::from_parts(&p.url, opened.ok().filter(|c| !c.is_empty()))
        });
        Ok((AppLimits::of(&app), proxy))
    }

    /// Forgets an application (and its routing) after it changed.
    pub fn invalidate_app(&self, app: &App) {
        self.invalidate_app_id(&app.id);
    }

    fn invalidate_app_id(&self, app: &AppId) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        write(&self.apps).retain(|_, cached| cached.id != *app);
        self.invalidate_routes(app);
    }

    /// Forgets everything (announcements may have been missed).
    fn clear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        write(&self.apps).clear();
        write(&self.routes).clear();
        write(&self.targets).clear();
    }

    /// Applies changes other processes announce until `stop` (shared stores only; a
    /// single-process store never announces anything).
    pub async fn follow(self: Arc<Self>, mut changes: broadcast::Receiver<CatalogChange>, stop: CancellationToken) {
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = stop.cancelled() => return,
            };
            match change {
                Ok(CatalogChange::App(app)) => self.invalidate_app_id(&app),
                Ok(CatalogChange::Endpoint(app, endpoint)) => self.invalidate_endpoint(&app, &endpoint),
                Ok(CatalogChange::All) | Err(broadcast::error::RecvError::Lagged(_)) => self.clear(),
                Ok(CatalogChange::RetryNow(..) | CatalogChange::Resend(..)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Forgets an endpoint after it changed.
    pub fn invalidate_endpoint(&self, app: &AppId, endpoint: &EndpointId) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        write(&self.targets).remove(endpoint);
        self.invalidate_routes(app);
    }

    fn invalidate_routes(&self, app: &AppId) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(targets) = write(&self.routes).remove(app) {
            let mut by_id = write(&self.targets);
            for target in targets.iter() {
                by_id.remove(&target.endpoint.id);
            }
        }
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}
