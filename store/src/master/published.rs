//! The near-engine tier: keys a client holds in its own VRAM or DRAM, outside the pool,
//! published with a TTL so that schedulers see them. The store never serves them: gets, exists
//! and eviction look at pool objects only; queries report them as `published` locations.
//!
//! Publishing needs a client the master knows (one that mounted a segment), and a client
//! dropped for silence loses its publications. Re-publishing a key renews its TTL; an entry
//! past its TTL is ignored by queries at once and dropped by the next sweep.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};
use crate::master::events::Place;
use crate::master::{check_key, Master, State, MAX_OBJECT_SIZE};
use crate::proto::{EventKind, PublishedKey, Tier};

/// How often the sweep looks for expired entries.
const EXPIRY_SCAN: Duration = Duration::from_secs(1);

pub(super) struct Entry {
    pub client: Arc<str>,
    pub tier: Tier,
    pub size: u64,
    pub expires: Instant,
}

#[derive(Default)]
pub(super) struct Published {
    pub by_key: HashMap<String, Vec<Entry>>,
    /// Entries per publishing client.
    pub per_client: HashMap<Arc<str>, u64>,
    pub total: usize,
    last_scan: Option<Instant>,
}

impl Published {
    /// Live entries of `key` at `now`.
    pub fn live<'a>(&'a self, key: &str, now: Instant) -> impl Iterator<Item = &'a Entry> + 'a {
        self.by_key.get(key).into_iter().flatten().filter(move |e| e.expires > now)
    }

    fn remove_entry(&mut self, key: &str, client: &str) -> Option<Entry> {
        let list = self.by_key.get_mut(key)?;
        let pos = list.iter().position(|e| &*e.client == client)?;
        let entry = list.swap_remove(pos);
        if list.is_empty() {
            self.by_key.remove(key);
        }
        self.total -= 1;
        if let Some(n) = self.per_client.get_mut(client) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(client);
            }
        }
        Some(entry)
    }
}

impl Master {
    /// Publishes (or renews) near-engine keys of `client_id`; returns how many.
    pub fn publish(&self, client_id: &str, tier: i32, ttl_ms: u64, keys: &[PublishedKey]) -> Result<u64> {
        let tier = match Tier::try_from(tier) {
            Ok(t @ (Tier::Vram | Tier::Dram)) => t,
            _ => {
                return Err(StoreError::InvalidArgument(format!(
                    "published keys are in tier VRAM or DRAM (got {tier})"
                )))
            }
        };
        let ttl = Duration::from_millis(ttl_ms);
        if ttl.is_zero() || ttl > self.config.publish_max_ttl {
            return Err(StoreError::InvalidArgument(format!(
                "ttl_ms {ttl_ms} is not in 1..={}",
                self.config.publish_max_ttl.as_millis()
            )));
        }
        for k in keys {
            check_key(&k.key)?;
            if k.size > MAX_OBJECT_SIZE {
                return Err(StoreError::InvalidArgument(format!("size {} of {:?} is too large", k.size, k.key)));
            }
        }
        let now = Instant::now();
        let mut st = self.state.lock();
        let st = &mut *st;
        if !st.core.clients.contains_key(client_id) {
            return Err(StoreError::ClientNotFound(client_id.to_string()));
        }
        let (host, segment) = Self::client_place(st, client_id);
        let client: Arc<str> = match st.published.per_client.get_key_value(client_id) {
            Some((k, _)) => k.clone(),
            None => Arc::from(client_id),
        };
        let expires = now + ttl;
        let mut added = 0;
        for k in keys {
            let list = st.published.by_key.entry(k.key.clone()).or_default();
            if let Some(e) = list.iter_mut().find(|e| e.client == client) {
                let was_live = e.expires > now;
                *e = Entry { client: client.clone(), tier, size: k.size, expires };
                if !was_live {
                    self.emit(
                        EventKind::Published,
                        &k.key,
                        k.size,
                        Place { tier, client_id, host: &host, segment: &segment },
                    );
                }
                continue;
            }
            if st.published.total >= self.config.max_published_keys {
                if list.is_empty() {
                    st.published.by_key.remove(&k.key);
                }
                self.metrics.published_keys.set(st.published.total as i64);
                return Err(StoreError::NoSpace {
                    size: 0,
                    replicas: 0,
                    detail: format!("{} near-engine keys are published already", self.config.max_published_keys),
                });
            }
            list.push(Entry { client: client.clone(), tier, size: k.size, expires });
            st.published.total += 1;
            added += 1;
            self.emit(EventKind::Published, &k.key, k.size, Place { tier, client_id, host: &host, segment: &segment });
        }
        *st.published.per_client.entry(client).or_default() += added;
        self.metrics.published_keys.set(st.published.total as i64);
        Ok(keys.len() as u64)
    }

    /// Retracts near-engine keys of `client_id` (all of them with `all`); returns how many.
    pub fn retract(&self, client_id: &str, keys: &[String], all: bool) -> Result<u64> {
        for k in keys {
            check_key(k)?;
        }
        let mut st = self.state.lock();
        if all {
            return Ok(self.retract_client(&mut st, client_id));
        }
        let now = Instant::now();
        let (host, segment) = Self::client_place(&st, client_id);
        let mut n = 0;
        for k in keys {
            if let Some(e) = st.published.remove_entry(k, client_id) {
                n += 1;
                if e.expires > now {
                    let place = Place { tier: e.tier, client_id, host: &host, segment: &segment };
                    self.emit(EventKind::Retracted, k, e.size, place);
                }
            }
        }
        self.metrics.published_keys.set(st.published.total as i64);
        Ok(n)
    }

    /// Drops every publication of a client (retract all, or the client was dropped).
    pub(super) fn retract_client(&self, st: &mut State, client_id: &str) -> u64 {
        if !st.published.per_client.contains_key(client_id) {
            return 0;
        }
        let keys: Vec<String> = st
            .published
            .by_key
            .iter()
            .filter(|(_, l)| l.iter().any(|e| &*e.client == client_id))
            .map(|(k, _)| k.clone())
            .collect();
        let now = Instant::now();
        let (host, segment) = Self::client_place(st, client_id);
        for k in &keys {
            if let Some(e) = st.published.remove_entry(k, client_id) {
                if e.expires > now {
                    self.emit(
                        EventKind::Retracted,
                        k,
                        e.size,
                        Place { tier: e.tier, client_id, host: &host, segment: &segment },
                    );
                }
            }
        }
        st.published.per_client.remove(client_id);
        self.metrics.published_keys.set(st.published.total as i64);
        keys.len() as u64
    }

    /// Drops entries past their TTL (at most once per second).
    pub(super) fn expire_published(&self, st: &mut State, now: Instant) {
        if st.published.total == 0
            || st.published.last_scan.is_some_and(|t| now.saturating_duration_since(t) < EXPIRY_SCAN)
        {
            return;
        }
        st.published.last_scan = Some(now);
        let expired: Vec<(String, Arc<str>)> = st
            .published
            .by_key
            .iter()
            .flat_map(|(k, l)| l.iter().filter(|e| e.expires <= now).map(move |e| (k.clone(), e.client.clone())))
            .collect();
        for (k, client) in expired {
            if let Some(e) = st.published.remove_entry(&k, &client) {
                let (host, segment) = Self::client_place(st, &client);
                self.emit(
                    EventKind::Retracted,
                    &k,
                    e.size,
                    Place { tier: e.tier, client_id: &client, host: &host, segment: &segment },
                );
            }
        }
        self.metrics.published_keys.set(st.published.total as i64);
    }

    /// Where a client's published keys are reported: the host and name of its first segment.
    pub(super) fn client_place(st: &State, client_id: &str) -> (String, String) {
        match Self::client_segment(st, client_id).and_then(|id| st.core.segments.get(&id)) {
            Some(seg) => (seg.host.clone(), seg.name.clone()),
            None => (String::new(), String::new()),
        }
    }

    /// The lowest-numbered segment a client has mounted.
    pub(super) fn client_segment(st: &State, client_id: &str) -> Option<u64> {
        st.core.clients.get(client_id)?.segments.iter().copied().filter(|id| st.core.segments.contains_key(id)).min()
    }
}
