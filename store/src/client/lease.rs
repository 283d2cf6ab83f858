//! The read lease a replica list grants, timed by the reader.
//!
//! The master leases an object for `lease_ttl_ms` from when it answers a get's replica list
//! (or a warm-up's plan): while the lease lasts, the object is neither evicted nor removed, so
//! the listed ranges hold its bytes. Once it ends, a range may be given to another object and
//! written over. A read from memory that ends after the lease may therefore hold another
//! object's bytes, in part or whole. Such a read fails with [`StoreError::LeaseExpired`]
//! instead of returning them, and never feeds the hot cache. (The engine's transfer timeout,
//! 30 s by default, is longer than the default lease of 10 s, so a slow link can get there.)
//!
//! The reader's clock starts before it sends the request, so it never runs behind the master's
//! clock for the same lease. Disk copies do not depend on it: their files are pinned while read
//! and checked against their checksum.

use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};
use crate::proto::GetReplicaListReply;

/// When a lease was asked for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseClock(Instant);

impl LeaseClock {
    /// Starts the clock: call right before sending the request that grants the lease.
    pub(crate) fn start() -> LeaseClock {
        LeaseClock(Instant::now())
    }

    /// Ok while a lease of `ttl_ms` asked at this clock's start still holds. A `ttl_ms` of 0
    /// (a master that does not say) is taken as no limit.
    pub(crate) fn held(self, key: &str, ttl_ms: u64) -> Result<()> {
        let ttl = Duration::from_millis(ttl_ms);
        let took = self.0.elapsed();
        if ttl_ms == 0 || took < ttl {
            return Ok(());
        }
        Err(StoreError::LeaseExpired { key: key.to_string(), lease_ms: ttl_ms, took_ms: took.as_millis() as u64 })
    }

    /// Whether `ttl_ms` (0: no limit) has passed since the clock's start.
    pub(crate) fn past(self, ttl_ms: u64) -> bool {
        ttl_ms != 0 && self.0.elapsed() >= Duration::from_millis(ttl_ms)
    }
}

/// A replica list with the clock of the lease it grants.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub(crate) reply: GetReplicaListReply,
    pub(crate) clock: LeaseClock,
}

impl Listed {
    /// Ok while the list's lease still holds (see the module's doc).
    pub(crate) fn lease_held(&self, key: &str) -> Result<()> {
        self.clock.held(key, self.reply.lease_ttl_ms)
    }

    /// When the list's lease ends: a read that ends later is refused as [`Self::lease_held`]
    /// refuses it (`None`: the master stated no lease).
    pub(crate) fn lease_end(&self) -> Option<Instant> {
        (self.reply.lease_ttl_ms != 0).then(|| self.clock.0 + Duration::from_millis(self.reply.lease_ttl_ms))
    }
}

impl Deref for Listed {
    type Target = GetReplicaListReply;

    fn deref(&self) -> &GetReplicaListReply {
        &self.reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_ends_after_the_lease_is_refused_and_one_within_it_is_not() {
        let now = LeaseClock::start();
        assert!(now.held("k", 10_000).is_ok());
        let long_ago = LeaseClock(Instant::now() - Duration::from_millis(1500));
        match long_ago.held("k", 1000) {
            Err(StoreError::LeaseExpired { key, lease_ms: 1000, took_ms }) => {
                assert_eq!(key, "k");
                assert!(took_ms >= 1500, "{took_ms}");
            }
            other => panic!("expected LeaseExpired, got {other:?}"),
        }
        assert!(long_ago.held("k", 0).is_ok(), "a master that states no lease sets no limit");
        assert!(long_ago.past(1000) && !long_ago.past(3_600_000) && !now.past(3_600_000));
        assert!(!long_ago.past(0), "a master that states no put timeout sets no limit");
    }
}
