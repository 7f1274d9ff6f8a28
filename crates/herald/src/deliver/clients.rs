//! The HTTP clients (each with its connection pool) kept for applications' own proxies and
//! endpoints' own TLS identities: least recently used first out, and no application holds
//! more than its share. An application that adds client certificate after client
//! certificate only ever pushes out its own clients, never another's warm pools.

use std::hash::Hash;
use std::num::NonZeroUsize;

use lru::LruCache;

use crate::ids::AppId;

pub struct ClientCache<K: Hash + Eq, V> {
    clients: LruCache<K, (AppId, V)>,
    /// Clients one application may hold.
    share: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> ClientCache<K, V> {
    /// At most `capacity` clients, `share` of them per application.
    pub fn new(capacity: usize, share: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity.max(1)).expect("positive");
        Self { clients: LruCache::new(capacity), share: share.clamp(1, capacity.get()) }
    }

    /// The client for `key`, made with `make` for `app` if there is none; an application
    /// at its share first gives up its own least recently used one.
    pub fn get_or_make(&mut self, app: &AppId, key: &K, make: impl FnOnce() -> V) -> V {
        if let Some((_, client)) = self.clients.get(key) {
            return client.clone();
        }
        if self.held_by(app) >= self.share {
            let oldest = self.clients.iter().rev().find(|(_, (owner, _))| owner == app).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.clients.pop(&oldest);
            }
        }
        let client = make();
        self.clients.push(key.clone(), (app.clone(), client.clone()));
        client
    }

    fn held_by(&self, app: &AppId) -> usize {
        self.clients.iter().filter(|(_, (owner, _))| owner == app).count()
    }

    #[cfg(test)]
    fn contains(&self, key: &K) -> bool {
        self.clients.contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_application_with_many_certificates_pushes_out_only_its_own_clients() {
        let mut cache = ClientCache::new(8, 3);
        let (victim, flood) = (AppId::generate(), AppId::generate());
        cache.get_or_make(&victim, &"victim-1".to_owned(), || 1);
        cache.get_or_make(&victim, &"victim-2".to_owned(), || 2);
        for i in 0..1000 {
            cache.get_or_make(&flood, &format!("flood-{i}"), || i);
        }
        let kept = |k: &str| cache.contains(&k.to_owned());
        assert!(kept("victim-1") && kept("victim-2"), "the other tenant's pools stay warm");
        assert_eq!(cache.held_by(&flood), 3, "the flood holds its share");
        assert_eq!(cache.get_or_make(&victim, &"victim-1".to_owned(), || 99), 1, "found, not made again");
    }

    #[test]
    fn the_whole_cache_is_bounded_least_recently_used_first() {
        let mut cache = ClientCache::new(4, 4);
        let apps: Vec<AppId> = (0..6).map(|_| AppId::generate()).collect();
        for (i, app) in apps.iter().enumerate() {
            cache.get_or_make(app, &i, || i);
        }
        assert!(!cache.contains(&0) && !cache.contains(&1), "the two least recently used went");
        assert!((2..6).all(|i| cache.contains(&i)));
    }
}
