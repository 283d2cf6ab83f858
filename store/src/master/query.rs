//! Queries for cache-aware schedulers: where keys are (node, tier, size), the longest cached
//! prefix per node, and per-node load. Read-only: no lease is granted or renewed and no
//! object's place in the eviction order moves.
//!
//! A batch of keys is answered one key at a time, each under its shard's lock (and the global
//! state's), so that a 100k-key query does not stall puts and gets for its whole duration. A
//! prefix query holds every shard for its keys (its answer needs one consistent view).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Result, StoreError};
use crate::master::{check_key, Master, State};
use crate::proto::{
    KeyLocations, Location, Node, NodePrefix, NodeStats, NodeStatsReply, PrefixQueryReply, QueryKeysReply, Tier,
};

/// Most keys in one query.
pub const MAX_QUERY_KEYS: usize = 1 << 20;
pub use super::core::load::{Load, RATE_WINDOW_SECS};

/// Identity of a node in one reply's node table.
#[derive(Hash, PartialEq, Eq, Clone)]
enum NodeKey {
    Segment(u64),
    Client(Arc<str>),
}

/// Builds a reply's node table.
#[derive(Default)]
struct Nodes {
    index: HashMap<NodeKey, u32>,
    list: Vec<Node>,
    /// The last segment looked up (keys of a batch often sit on the same segment).
    last: Option<(u64, u32)>,
}

impl Nodes {
    fn segment(&mut self, st: &State, id: u64) -> Option<u32> {
        if let Some((last, i)) = self.last {
            if last == id {
                return Some(i);
            }
        }
        if let Some(&i) = self.index.get(&NodeKey::Segment(id)) {
            self.last = Some((id, i));
            return Some(i);
        }
        let seg = st.core.segments.get(&id)?;
        let i = self.list.len() as u32;
        self.list.push(Node {
            client_id: seg.client_id.clone(),
            host: seg.host.clone(),
            segment: seg.name.clone(),
            segment_id: id,
        });
        self.index.insert(NodeKey::Segment(id), i);
        self.last = Some((id, i));
        Some(i)
    }

    /// A publisher is shown as its first segment, or as a node of its own without one.
    fn publisher(&mut self, st: &State, client: &Arc<str>) -> u32 {
        if let Some(i) = Master::client_segment(st, client).and_then(|id| self.segment(st, id)) {
            return i;
        }
        let key = NodeKey::Client(client.clone());
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(Node { client_id: client.to_string(), ..Default::default() });
        self.index.insert(key, i);
        i
    }
}

fn check_keys(keys: &[String]) -> Result<()> {
    if keys.len() > MAX_QUERY_KEYS {
        return Err(StoreError::InvalidArgument(format!(
            "{} keys in one query (at most {MAX_QUERY_KEYS})",
            keys.len()
        )));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

/// Tier rank for "best copy": VRAM before DRAM before SSD.
fn rank(t: Tier) -> u8 {
    match t {
        Tier::Vram => 0,
        Tier::Dram => 1,
        Tier::Ssd => 2,
        Tier::Unspecified => 3,
    }
}

impl Master {
    /// Where each key is: committed pool replicas and live published copies, with node and tier.
    pub fn query_keys(&self, keys: &[String]) -> Result<QueryKeysReply> {
        check_keys(keys)?;
        self.metrics.queried_keys.inc_by(keys.len() as u64);
        let mut nodes = Nodes::default();
        let mut items = Vec::with_capacity(keys.len());
        // One key's shard (and the global state) at a time: no call waits behind a long query.
        for key in keys {
            let now = Instant::now();
            let st = self.lock_key(key);
            items.push(Self::locate(&st, &mut nodes, key, now));
        }
        Ok(QueryKeysReply { status: None, nodes: nodes.list, items })
    }

    fn locate(st: &super::Locked<'_>, nodes: &mut Nodes, key: &str, now: Instant) -> KeyLocations {
        let mut out = KeyLocations::default();
        if let Some(obj) = st.objects.get(key).filter(|o| o.complete) {
            out.exists = true;
            out.size = obj.size;
            out.locations.reserve_exact(obj.replicas.len() + obj.ssd.len());
            // Memory replicas, then disk copies (tier SSD).
            for id in obj.replicas.iter().map(|r| r.segment_id).chain(obj.ssd.iter().copied()) {
                if let (Some(node), Some(seg)) = (nodes.segment(st, id), st.core.segments.get(&id)) {
                    out.locations.push(Location { node, tier: seg.tier as i32, published: false, size: obj.size });
                }
            }
        }
        if st.published.total == 0 {
            return out;
        }
        for e in st.published.live(key, now) {
            let node = nodes.publisher(st, &e.client);
            out.locations.push(Location { node, tier: e.tier as i32, published: true, size: e.size });
        }
        out
    }

    /// For an ordered list of chunk keys: the leading chunks committed in the pool, and for each
    /// node holding the first chunk, how many leading chunks it holds (pool or published).
    pub fn prefix_query(&self, keys: &[String]) -> Result<PrefixQueryReply> {
        check_keys(keys)?;
        self.metrics.queried_keys.inc_by(keys.len() as u64);
        let now = Instant::now();
        let st = self.lock_all();
        let mut pool_prefix: Option<u32> = None;
        // Nodes (by client id) that hold every chunk so far.
        let mut alive: HashMap<String, NodePrefix> = HashMap::new();
        let mut done: Vec<NodePrefix> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            // Best copy per node of this chunk: (tier rank, tier, size, host).
            let mut here: HashMap<&str, (u8, Tier, u64, &str)> = HashMap::new();
            let obj = st.objects.get(key).filter(|o| o.complete);
            if obj.is_none() && pool_prefix.is_none() {
                pool_prefix = Some(i as u32);
            }
            if let Some(obj) = obj {
                for id in obj.replicas.iter().map(|r| r.segment_id).chain(obj.ssd.iter().copied()) {
                    if let Some(seg) = st.core.segments.get(&id) {
                        let cand = (rank(seg.tier), seg.tier, obj.size, seg.host.as_str());
                        let best = here.entry(seg.client_id.as_str()).or_insert(cand);
                        if cand.0 < best.0 {
                            *best = cand;
                        }
                    }
                }
            }
            for e in st.published.live(key, now) {
                let host = Self::client_segment(&st, &e.client)
                    .and_then(|id| st.core.segments.get(&id))
                    .map_or("", |s| s.host.as_str());
                let cand = (rank(e.tier), e.tier, e.size, host);
                let best = here.entry(&e.client).or_insert(cand);
                if cand.0 < best.0 {
                    *best = cand;
                }
            }
            if i == 0 {
                for (client, (_, _, _, host)) in &here {
                    alive.insert(
                        client.to_string(),
                        NodePrefix { client_id: client.to_string(), host: host.to_string(), ..Default::default() },
                    );
                }
            }
            let gone: Vec<String> = alive.keys().filter(|c| !here.contains_key(c.as_str())).cloned().collect();
            for c in gone {
                done.extend(alive.remove(&c));
            }
            for (client, (_, tier, size, _)) in &here {
                if let Some(p) = alive.get_mut(*client) {
                    p.prefix_len += 1;
                    p.prefix_bytes += size;
                    match tier {
                        Tier::Vram => p.vram += 1,
                        Tier::Dram => p.dram += 1,
                        Tier::Ssd => p.ssd += 1,
                        Tier::Unspecified => {}
                    }
                }
            }
            if alive.is_empty() && pool_prefix.is_some() {
                break;
            }
        }
        drop(st);
        done.extend(alive.into_values());
        done.sort_by(|a, b| {
            b.prefix_len.cmp(&a.prefix_len).then(b.vram.cmp(&a.vram)).then(a.client_id.cmp(&b.client_id))
        });
        Ok(PrefixQueryReply { status: None, pool_prefix_len: pool_prefix.unwrap_or(keys.len() as u32), nodes: done })
    }

    /// Per node (client): capacity, used, objects, recent get/put rates, published keys.
    pub fn node_stats(&self) -> NodeStatsReply {
        let now = Instant::now();
        let st = self.state.lock();
        let mut nodes: Vec<NodeStats> = st
            .core
            .clients
            .iter()
            .map(|(id, c)| {
                let mut n = NodeStats {
                    client_id: id.clone(),
                    ms_since_ping: now.saturating_duration_since(c.last_ping).as_millis() as u64,
                    published_keys: st.published.per_client.get(id.as_str()).copied().unwrap_or(0),
                    ..Default::default()
                };
                let mut segs: Vec<u64> = c.segments.iter().copied().collect();
                segs.sort_unstable();
                for seg in segs.iter().filter_map(|s| st.core.segments.get(s)) {
                    if n.host.is_empty() {
                        n.host = seg.host.clone();
                    }
                    n.segments.push(seg.name.clone());
                    n.capacity += seg.alloc.capacity();
                    n.used += seg.alloc.reserved();
                    n.objects += seg.alloc.blocks();
                    n.get_rate += seg.load.gets.per_second(now);
                    n.put_rate += seg.load.puts.per_second(now);
                }
                n
            })
            .collect();
        nodes.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        NodeStatsReply { status: None, nodes, window_ms: (RATE_WINDOW_SECS * 1000) as u32 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::core::load::Rate;
    use std::time::Duration;

    #[test]
    fn rates_count_recent_events_and_forget_old_ones() {
        let mut r = Rate::default();
        let t0 = Instant::now() + Duration::from_secs(100);
        for _ in 0..50 {
            r.record(t0);
        }
        assert_eq!(r.per_second(t0), 5.0);
        assert_eq!(r.per_second(t0 + Duration::from_secs(RATE_WINDOW_SECS + 1)), 0.0);
        r.record(t0 + Duration::from_secs(RATE_WINDOW_SECS * 3));
        assert_eq!(r.per_second(t0 + Duration::from_secs(RATE_WINDOW_SECS * 3)), 0.1);
    }
}
