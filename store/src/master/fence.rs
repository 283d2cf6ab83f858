//! Who may change the master's state: a single master always; under HA only the leader, and
//! only while its etcd lease certainly holds.
//!
//! A leader's lease is renewed by keep-alives. etcd expires it `ttl` after the last keep-alive
//! it *received*, which is after the leader *sent* it; so `sent + ttl` is a lower bound of the
//! expiry and the leader writes only before `sent + ttl − margin` (the margin covers clock rate
//! differences and a write that started just before the deadline). A leader frozen
//! (SIGSTOP, a long pause) and then continued finds its deadline passed and refuses every write
//! before it learns anything else — before a new leader can have been elected, since that
//! needs the lease gone at etcd. Sans-IO: the time is an argument, tests use a fake clock.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Result, StoreError};

/// What this master is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No HA: the only master, always writable.
    Single,
    /// HA, not the leader; the leader's address when known.
    Standby {
        /// The leader's RPC address, when known.
        leader: Option<String>,
    },
    /// HA leader of `term` until `deadline` (monotonic clock).
    Leader {
        /// The leadership's term (the leader key's create revision in etcd).
        term: u64,
        /// The last instant it may write at.
        deadline: Instant,
    },
}

/// The guard every state-changing call of the master passes ([`Fence::check`]): what this
/// master is now, behind a lock.
pub struct Fence {
    role: Mutex<Role>,
}

impl Fence {
    /// A fence starting as `role`.
    pub fn new(role: Role) -> Self {
        Fence { role: Mutex::new(role) }
    }

    /// What this master is now.
    pub fn role(&self) -> Role {
        self.role.lock().clone()
    }

    /// `Ok` when a write may be served at `now`.
    pub fn check(&self, now: Instant) -> Result<()> {
        match &*self.role.lock() {
            Role::Single => Ok(()),
            Role::Leader { deadline, .. } if now < *deadline => Ok(()),
            Role::Leader { term, .. } => Err(StoreError::NotLeader(format!(
                "this master's leadership (term {term}) may have lapsed: its lease was not renewed in time"
            ))),
            Role::Standby { leader: Some(l) } => {
                Err(StoreError::NotLeader(format!("this master is a standby; the leader is {l}")))
            }
            Role::Standby { leader: None } => {
                Err(StoreError::NotLeader("this master is a standby; no leader is elected right now".into()))
            }
        }
    }

    /// Whether this master leads (or is the single master) at `now`.
    pub fn leads(&self, now: Instant) -> bool {
        self.check(now).is_ok()
    }

    /// Became the leader of `term`, writable until `deadline`.
    pub fn lead(&self, term: u64, deadline: Instant) {
        *self.role.lock() = Role::Leader { term, deadline };
    }

    /// A keep-alive sent at `sent` was answered with the lease still alive: the leader may
    /// write until `sent + ttl − margin` (never moved back). Returns whether it still leads.
    pub fn renewed(&self, sent: Instant, ttl: Duration, margin: Duration) -> bool {
        let mut role = self.role.lock();
        match &mut *role {
            Role::Leader { deadline, .. } => {
                let d = sent + ttl.saturating_sub(margin);
                if d > *deadline {
                    *deadline = d;
                }
                true
            }
            _ => false,
        }
    }

    /// Lost (or never had) the leadership: a standby, `leader` leading when known.
    pub fn stand_by(&self, leader: Option<String>) {
        *self.role.lock() = Role::Standby { leader };
    }

    /// A standby learnt who leads now.
    pub fn set_leader(&self, leader: Option<String>) {
        let mut role = self.role.lock();
        if let Role::Standby { leader: l } = &mut *role {
            *l = leader;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);
    const MARGIN: Duration = Duration::from_millis(300);

    #[test]
    fn a_leader_writes_only_until_its_last_keep_alive_sent_plus_ttl_minus_margin() {
        let t0 = Instant::now();
        let f = Fence::new(Role::Standby { leader: None });
        assert!(matches!(f.check(t0), Err(StoreError::NotLeader(_))));
        // Elected with the lease granted at t0.
        f.lead(7, t0 + TTL - MARGIN);
        assert!(f.check(t0 + Duration::from_millis(1699)).is_ok());
        assert!(f.check(t0 + Duration::from_millis(1700)).is_err(), "deadline reached");
        // A keep-alive sent at t0+600ms answered: writable until 2.3 s.
        assert!(f.renewed(t0 + Duration::from_millis(600), TTL, MARGIN));
        assert!(f.check(t0 + Duration::from_millis(2299)).is_ok());
        assert!(f.check(t0 + Duration::from_millis(2300)).is_err());
        // An answer to an older keep-alive arriving late never moves the deadline back.
        f.renewed(t0, TTL, MARGIN);
        assert!(f.check(t0 + Duration::from_millis(2299)).is_ok());
    }

    #[test]
    fn a_frozen_leader_continued_refuses_writes_even_when_a_late_answer_comes() {
        let t0 = Instant::now();
        let f = Fence::new(Role::Standby { leader: None });
        f.lead(3, t0 + TTL - MARGIN);
        f.renewed(t0 + Duration::from_millis(600), TTL, MARGIN);
        // Frozen for 10 s: etcd expired the lease and elected another leader meanwhile.
        let woke = t0 + Duration::from_secs(10);
        assert!(f.check(woke).is_err(), "refuses writes before anything else happens");
        // The answer to the keep-alive it sent just before the freeze arrives now.
        f.renewed(t0 + Duration::from_millis(1200), TTL, MARGIN);
        assert!(f.check(woke).is_err(), "still refused: the answer proves nothing about now");
        let e = f.check(woke).unwrap_err().to_string();
        assert!(e.contains("term 3"), "{e}");
        f.stand_by(Some("10.0.0.2:50051".into()));
        let e = f.check(woke).unwrap_err().to_string();
        assert!(e.contains("the leader is 10.0.0.2:50051"), "{e}");
        assert!(!f.renewed(woke, TTL, MARGIN), "a standby is not renewed into a leader");
    }

    #[test]
    fn a_single_master_always_writes() {
        let f = Fence::new(Role::Single);
        assert!(f.check(Instant::now() + Duration::from_secs(1_000_000)).is_ok());
    }
}
