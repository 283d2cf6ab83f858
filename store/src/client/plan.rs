//! What a get reads and what a put writes, decided from the master's answer alone (no I/O, no
//! clock): the executor ([`super::read`], [`super::write`]) carries the plans out.
//!
//! A **read plan** is the ordered list of sources to try for one key: this client's own
//! replica (a memcpy), the hot cache's entry, remote replicas (an engine read, filling the hot
//! cache), this client's disk file, other clients' disk files (through their disk service).
//! The executor tries them in order until one serves the read; a caller's mistake or an
//! expired lease ends the read at once (the other sources share the lease and would be no
//! better).
//!
//! An **early read** is a read made while the master answers, from a source this client
//! chose on what it knew before the answer ([`Early`]): the hot cache's entry of the key, or
//! this client's disk file when that was the object's only copy. It is a guess: the answer
//! judges it ([`verdict`]), and a plan made after one ([`read_plan_after`]) starts with
//! [`Step::Kept`] where it served the read, or reads over it as if it had not been made.
//!
//! A **write plan** splits a put's replicas into this client's own (a memcpy) and remote ones
//! (engine writes, through the staging buffer for byte values). After the writes, [`settle`]
//! decides per key what the master hears: commit the written puts, revoke every other put the
//! master had started.

use super::hot_cache::Identity;
use crate::error::StoreError;
use crate::proto::{GetReplicaListReply, ReplicaDescriptor, ReplicaStatus, Tier};

/// A get copies its hits early (while the master answers) only when it copies at least this
/// many bytes: the early path hands the call to the background runtime and, when the copy ends
/// before the answer, waits for that thread to wake it, which costs more than the copy hides
/// for small values. Measured on this VM (`benches/hotcache.sh hot-cache --link unshaped
/// --pairs 1 -- --methods get,batchGet --sizes 64K,256K,1M,4M`, 2026-12-04 22:51-22:53 UTC,
/// alternated, two runs each), warm call early / asking first: `get` 64 KiB 0.14 / 0.12 ms,
/// 256 KiB 0.21-0.23 / 0.13 ms, 1 MiB 0.14-0.16 / 0.25-0.26 ms; `batchGet` of 5 x 64 KiB
/// 0.16-0.24 / 0.14-0.16 ms, of 5 x 256 KiB 0.19-0.20 / 0.25-0.29 ms.
pub(crate) const EARLY_COPY_FROM: u64 = 1 << 20;

/// Whether a get whose hits copy `bytes` in all copies them early (see [`EARLY_COPY_FROM`]).
pub(crate) fn worth_copying_early(bytes: u64) -> bool {
    bytes >= EARLY_COPY_FROM
}

/// What the client knows beside the master's answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known<'a> {
    /// This client's memory segment.
    pub me: &'a str,
    /// This client's disk, as the master names it, when it has a disk tier.
    pub our_disk: Option<&'a str>,
    /// The hot cache, as far as this read goes.
    pub hot: Hot,
}

/// The hot cache's part in one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hot {
    /// No cache, or the object is not a candidate (this client holds a replica).
    Off,
    /// A candidate the cache does not hold: remote reads may fill it (when the read takes the
    /// whole value).
    Missed { whole: bool },
    /// The cache holds this very object (an entry is held for the read).
    Hit,
}

/// One source of a read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Step<'l> {
    /// The hot cache's entry.
    Cached,
    /// A replica in this client's own segment.
    Local(&'l ReplicaDescriptor),
    /// A replica in another client's segment; `fill`: the bytes also go into the hot cache.
    Remote { replica: &'l ReplicaDescriptor, fill: bool },
    /// This client's disk file of the object.
    OwnDisk,
    /// Another client's disk file, read through its disk service.
    RemoteDisk(&'l ReplicaDescriptor),
    /// Nothing to read: an early read the answer confirmed put the object in the destination.
    Kept,
}

/// What an early read read into the destination, from a source chosen before the master
/// answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Early {
    /// The hot cache's entry was copied: the object `Identity` names (what the master said the
    /// key was when the entry was filled).
    HotCopy(Identity),
    /// This client's disk file of the key's `version`, of `size` bytes (the object's only copy
    /// when this client last looked), was read; `read`: whether it read without error.
    OwnDisk { version: u64, size: u64, read: bool },
}

/// What the master's answer makes of an early read, before the hot cache is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict<'e> {
    /// The destination holds the object the answer describes: the read is done.
    Stands,
    /// It may hold another object's bytes, or none: the read goes on over them.
    Falls,
    /// It holds the object if the hot cache's entry for the answer is the entry copied, the
    /// object this identity names: the cache's look-up of the answer tells (an entry filled
    /// again meanwhile is another copy, even of the same object).
    IfCached(&'e Identity),
}

/// Judges an early read by the master's answer `list` (`our_disk`: this client's disk, as the
/// master names it). A disk read stands when it read without error the file of the version and
/// size the answer describes, and the answer lists a complete copy on this client's disk: the
/// file may otherwise be another object's (a stale version) or one the master no longer
/// counts. A hot copy stands or falls on the cache's entry for the answer ([`Verdict::IfCached`]).
pub(crate) fn verdict<'e>(early: &'e Early, list: &GetReplicaListReply, our_disk: Option<&str>) -> Verdict<'e> {
    match early {
        Early::HotCopy(copied) => Verdict::IfCached(copied),
        Early::OwnDisk { version, size, read } => {
            let listed_here = our_disk.is_some_and(|d| list.replicas.iter().any(|r| on_disk(r) && r.segment_name == d));
            if *read && list.version == *version && list.size == *size && listed_here {
                Verdict::Stands
            } else {
                Verdict::Falls
            }
        }
    }
}

/// Whether the object has a copy in memory to read: a disk file an early read found confirmed
/// is then no longer its only copy (later gets read it from memory, not the file early).
pub(crate) fn held_in_memory(list: &GetReplicaListReply) -> bool {
    list.replicas.iter().any(readable_in_memory)
}

/// A committed replica in a memory segment: what the engine reads. Disk copies (tier SSD) are
/// read through their owner instead.
pub(crate) fn readable_in_memory(r: &ReplicaDescriptor) -> bool {
    r.status == ReplicaStatus::Complete as i32 && r.tier != Tier::Ssd as i32
}

fn on_disk(r: &ReplicaDescriptor) -> bool {
    r.status == ReplicaStatus::Complete as i32 && r.tier == Tier::Ssd as i32
}

/// Whether the hot cache may serve or keep the object: it has no committed replica in this
/// client's own segment (that one is a memcpy away already).
pub(crate) fn hot_candidate(list: &GetReplicaListReply, me: &str) -> bool {
    !list.replicas.iter().any(|r| r.status == ReplicaStatus::Complete as i32 && r.segment_name == me)
}

/// The sources of a read of the object `list` describes, best first.
pub(crate) fn read_plan<'l>(list: &'l GetReplicaListReply, known: Known<'_>) -> Vec<Step<'l>> {
    let mut plan = Vec::with_capacity(list.replicas.len() + 1);
    let memory = list.replicas.iter().filter(|r| readable_in_memory(r));
    plan.extend(memory.clone().filter(|r| r.segment_name == known.me).map(Step::Local));
    if known.hot == Hot::Hit && plan.is_empty() {
        plan.push(Step::Cached);
    }
    let fill = known.hot == Hot::Missed { whole: true };
    plan.extend(memory.filter(|r| r.segment_name != known.me).map(|replica| Step::Remote { replica, fill }));
    let ours = |r: &ReplicaDescriptor| known.our_disk == Some(r.segment_name.as_str());
    if list.replicas.iter().any(|r| on_disk(r) && ours(r)) {
        plan.push(Step::OwnDisk);
    }
    plan.extend(list.replicas.iter().filter(|r| on_disk(r) && !ours(r)).map(Step::RemoteDisk));
    plan
}

/// [`read_plan`] after an early read the answer judged `verdict` (none: no early read was
/// made): only [`Step::Kept`] where it served the read (it stands, or the cache's entry for the
/// answer, `held` on [`Hot::Hit`], is the one it copied), else the plan as without it, whose
/// sources write over what it wrote.
pub(crate) fn read_plan_after<'l>(
    list: &'l GetReplicaListReply,
    known: Known<'_>,
    verdict: Option<Verdict<'_>>,
    held: Option<&Identity>,
) -> Vec<Step<'l>> {
    let kept = match verdict {
        Some(Verdict::Stands) => true,
        Some(Verdict::IfCached(copied)) => known.hot == Hot::Hit && held == Some(copied),
        Some(Verdict::Falls) | None => false,
    };
    if kept {
        vec![Step::Kept]
    } else {
        read_plan(list, known)
    }
}

/// Whether a read that failed with `e` tries its next source: not after a caller's mistake or
/// an expired lease (the sources share the one lease).
pub(crate) fn try_next(e: &StoreError) -> bool {
    !(e.is_caller_error() || matches!(e, StoreError::LeaseExpired { .. }))
}

/// Where a put's bytes go.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct WritePlan<'r> {
    /// Replicas in this client's own segment: a memcpy.
    pub local: Vec<&'r ReplicaDescriptor>,
    /// Replicas in other clients' segments: engine writes.
    pub remote: Vec<&'r ReplicaDescriptor>,
}

/// Splits the replicas the master placed a put on.
pub(crate) fn write_plan<'r>(replicas: &'r [ReplicaDescriptor], me: &str) -> WritePlan<'r> {
    let (local, remote) = replicas.iter().partition(|r| r.segment_name == me);
    WritePlan { local, remote }
}

/// How one key of a put ended on the client's side.
#[derive(Debug)]
pub(crate) enum Written {
    /// The master refused to start it: nothing to tell it.
    Refused(StoreError),
    /// Every replica was written: commit.
    Done,
    /// The master started it but the bytes did not all arrive, whatever the reason: revoke it
    /// now, so that its space is not held until the master's put timeout.
    Failed(StoreError),
}

/// What a write does to a key that exists already (or is being put).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Mooncake's put: the key keeps its value, and the put succeeds.
    Put,
    /// Mooncake's upsert: the value is replaced (the old object removed, then put again).
    Upsert,
}

impl Mode {
    /// The options a write of this mode sends the master: an upsert's say so
    /// (`PutOptions.replace`: its object replaces the key's value even against a copy a holder
    /// reports later to a master rebuilding from reports; a plain put's gives way to one).
    pub(crate) fn options(self, options: &crate::proto::PutOptions) -> std::borrow::Cow<'_, crate::proto::PutOptions> {
        match self {
            Mode::Put => std::borrow::Cow::Borrowed(options),
            Mode::Upsert => std::borrow::Cow::Owned(crate::proto::PutOptions { replace: true, ..options.clone() }),
        }
    }
}

/// What becomes of a put the master refused to start, by the write's mode.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The key exists and keeps its value: the put succeeded.
    Kept,
    /// The key exists and the upsert replaces it: remove it and put again (the error stands
    /// if that fails).
    Replace(StoreError),
    /// The put failed.
    Failed(StoreError),
}

/// The rule for a refused put: only "already exists" is no failure (Mooncake's client turns it
/// into success for puts; an upsert replaces the object).
pub(crate) fn refusal(e: StoreError, mode: Mode) -> Refusal {
    match (e, mode) {
        (StoreError::AlreadyExists(_), Mode::Put) => Refusal::Kept,
        (e @ StoreError::AlreadyExists(_), Mode::Upsert) => Refusal::Replace(e),
        (e, _) => Refusal::Failed(e),
    }
}

/// What a batch of puts tells the master and its caller.
#[derive(Debug, PartialEq)]
pub(crate) struct Settled {
    /// Keys (by index) to commit.
    pub commit: Vec<usize>,
    /// Keys the master had started and the client gave up: revoke them.
    pub revoke: Vec<usize>,
    /// Keys an upsert found existing: remove them and put them again.
    pub replace: Vec<usize>,
}

/// What to tell the master after a batch of puts, and the result each key's caller sees until
/// the master commits (the committed keys' results are the commits' then; a key to replace
/// stays "already exists" unless its next put succeeds).
pub(crate) fn settle(written: Vec<Written>, mode: Mode) -> (Settled, Vec<crate::error::Result<()>>) {
    let mut settled = Settled { commit: Vec::new(), revoke: Vec::new(), replace: Vec::new() };
    let results = written
        .into_iter()
        .enumerate()
        .map(|(i, w)| match w {
            Written::Done => {
                settled.commit.push(i);
                Ok(())
            }
            Written::Failed(e) => {
                settled.revoke.push(i);
                Err(e)
            }
            Written::Refused(e) => match refusal(e, mode) {
                Refusal::Kept => Ok(()),
                Refusal::Replace(e) => {
                    settled.replace.push(i);
                    Err(e)
                }
                Refusal::Failed(e) => Err(e),
            },
        })
        .collect();
    (settled, results)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "10.0.0.1:7000";
    const OUR_DISK: &str = "disk:ours";

    fn replica(segment: &str, tier: Tier, status: ReplicaStatus) -> ReplicaDescriptor {
        ReplicaDescriptor {
            segment_name: segment.into(),
            address: 0x1000,
            tier: tier as i32,
            status: status as i32,
            ..Default::default()
        }
    }

    fn mem(segment: &str) -> ReplicaDescriptor {
        replica(segment, Tier::Dram, ReplicaStatus::Complete)
    }

    fn disk(segment: &str) -> ReplicaDescriptor {
        replica(segment, Tier::Ssd, ReplicaStatus::Complete)
    }

    fn list(replicas: Vec<ReplicaDescriptor>) -> GetReplicaListReply {
        GetReplicaListReply { replicas, size: 100, version: 7, ..Default::default() }
    }

    /// The plan as (source kind, segment): short to read in a table.
    fn plan_of(l: &GetReplicaListReply, hot: Hot, our_disk: Option<&str>) -> Vec<String> {
        read_plan(l, Known { me: ME, our_disk, hot })
            .into_iter()
            .map(|s| match s {
                Step::Cached => "cached".to_string(),
                Step::Local(r) => format!("local {}", r.segment_name),
                Step::Remote { replica, fill } => {
                    format!("remote {}{}", replica.segment_name, if fill { " +fill" } else { "" })
                }
                Step::OwnDisk => "own disk".to_string(),
                Step::RemoteDisk(r) => format!("remote disk {}", r.segment_name),
                Step::Kept => "kept".to_string(),
            })
            .collect()
    }

    #[test]
    fn read_plans_from_master_answers() {
        let missed = Hot::Missed { whole: true };
        // (what, the master's answer, the hot cache, our disk, the plan)
        type Case<'a> = (&'a str, GetReplicaListReply, Hot, Option<&'a str>, Vec<&'a str>);
        let table: Vec<Case<'_>> = vec![
            ("ours only", list(vec![mem(ME)]), Hot::Off, None, vec!["local 10.0.0.1:7000"]),
            (
                "ours is read first, wherever the master lists it",
                list(vec![mem("b:1"), mem(ME)]),
                Hot::Off,
                None,
                vec!["local 10.0.0.1:7000", "remote b:1"],
            ),
            ("remote, no cache", list(vec![mem("b:1"), mem("c:1")]), Hot::Off, None, vec!["remote b:1", "remote c:1"]),
            (
                "remote, cache missed: every remote read may fill it",
                list(vec![mem("b:1"), mem("c:1")]),
                missed,
                None,
                vec!["remote b:1 +fill", "remote c:1 +fill"],
            ),
            (
                "a ranged read fills nothing",
                list(vec![mem("b:1")]),
                Hot::Missed { whole: false },
                None,
                vec!["remote b:1"],
            ),
            ("cache hit first, replicas after", list(vec![mem("b:1")]), Hot::Hit, None, vec!["cached", "remote b:1"]),
            (
                "unfinished and disk replicas are no memory source",
                list(vec![replica("b:1", Tier::Dram, ReplicaStatus::Processing), disk("disk:x"), mem("c:1")]),
                Hot::Off,
                None,
                vec!["remote c:1", "remote disk disk:x"],
            ),
            (
                "our disk before others', after memory",
                list(vec![disk("disk:x"), disk(OUR_DISK), mem("b:1")]),
                Hot::Off,
                Some(OUR_DISK),
                vec!["remote b:1", "own disk", "remote disk disk:x"],
            ),
            (
                "a disk copy of ours seen without a disk tier is someone else's",
                list(vec![disk(OUR_DISK)]),
                Hot::Off,
                None,
                vec!["remote disk disk:ours"],
            ),
            (
                "an unfinished disk copy is not read",
                list(vec![replica(OUR_DISK, Tier::Ssd, ReplicaStatus::Processing)]),
                Hot::Off,
                Some(OUR_DISK),
                vec![],
            ),
            ("nothing to read", list(vec![]), missed, Some(OUR_DISK), vec![]),
        ];
        for (what, l, hot, our_disk, want) in table {
            assert_eq!(plan_of(&l, hot, our_disk), want, "{what}");
        }
    }

    #[test]
    fn the_cache_is_for_objects_without_a_replica_here() {
        assert!(hot_candidate(&list(vec![mem("b:1")]), ME));
        assert!(!hot_candidate(&list(vec![mem("b:1"), mem(ME)]), ME));
        // A replica here still being written is none to read: the cache may keep the object.
        assert!(hot_candidate(&list(vec![replica(ME, Tier::Dram, ReplicaStatus::Processing), mem("b:1")]), ME));
    }

    fn identity(segment: &str) -> Identity {
        Identity { version: 7, size: 100, segment: segment.into(), address: 0x1000 }
    }

    #[test]
    fn an_early_disk_read_stands_on_a_complete_copy_of_its_version_on_our_disk_alone() {
        let read = |version, size| Early::OwnDisk { version, size, read: true };
        // (what, the early read, the master's answer, our disk, whether it stands)
        type Case<'a> = (&'a str, Early, GetReplicaListReply, Option<&'a str>, bool);
        let table: Vec<Case<'_>> = vec![
            ("the file the answer lists", read(7, 100), list(vec![disk(OUR_DISK)]), Some(OUR_DISK), true),
            (
                "in memory again meanwhile: the file read is still the object",
                read(7, 100),
                list(vec![mem("b:1"), disk("disk:x"), disk(OUR_DISK)]),
                Some(OUR_DISK),
                true,
            ),
            (
                "a read that failed",
                Early::OwnDisk { version: 7, size: 100, read: false },
                list(vec![disk(OUR_DISK)]),
                Some(OUR_DISK),
                false,
            ),
            ("a stale file: another version", read(6, 100), list(vec![disk(OUR_DISK)]), Some(OUR_DISK), false),
            ("another size", read(7, 99), list(vec![disk(OUR_DISK)]), Some(OUR_DISK), false),
            ("only another disk's copy is listed", read(7, 100), list(vec![disk("disk:x")]), Some(OUR_DISK), false),
            (
                "our copy is unfinished",
                read(7, 100),
                list(vec![replica(OUR_DISK, Tier::Ssd, ReplicaStatus::Processing)]),
                Some(OUR_DISK),
                false,
            ),
            (
                "a memory replica under our disk's name is no disk copy",
                read(7, 100),
                list(vec![replica(OUR_DISK, Tier::Dram, ReplicaStatus::Complete)]),
                Some(OUR_DISK),
                false,
            ),
            ("no disk tier", read(7, 100), list(vec![disk(OUR_DISK)]), None, false),
            ("the master lists nothing", read(7, 100), list(vec![]), Some(OUR_DISK), false),
        ];
        for (what, early, l, our_disk, stands) in table {
            let want = if stands { Verdict::Stands } else { Verdict::Falls };
            assert_eq!(verdict(&early, &l, our_disk), want, "{what}");
        }
    }

    #[test]
    fn a_confirmed_disk_file_is_the_only_copy_unless_the_object_is_in_memory() {
        assert!(!held_in_memory(&list(vec![disk(OUR_DISK), disk("disk:x")])));
        assert!(held_in_memory(&list(vec![disk(OUR_DISK), mem("b:1")])));
        // A memory replica still being written is no copy to read.
        assert!(!held_in_memory(&list(vec![disk(OUR_DISK), replica("b:1", Tier::Dram, ReplicaStatus::Processing)])));
    }

    #[test]
    fn a_hot_copy_is_kept_only_where_the_cache_holds_the_very_entry_copied() {
        let l = list(vec![mem("b:1"), mem("c:1")]);
        let copied = Early::HotCopy(identity("b:1"));
        let judged = verdict(&copied, &l, Some(OUR_DISK));
        assert_eq!(judged, Verdict::IfCached(&identity("b:1")), "the cache's look-up judges it");
        let plan = |hot, held: Option<&Identity>| {
            read_plan_after(&l, Known { me: ME, our_disk: None, hot }, Some(judged), held)
        };
        let remote = |i: usize, fill| Step::Remote { replica: &l.replicas[i], fill };
        assert_eq!(plan(Hot::Hit, Some(&identity("b:1"))), vec![Step::Kept]);
        // Filled again meanwhile (from another replica of the same object): its own copy.
        assert_eq!(plan(Hot::Hit, Some(&identity("c:1"))), vec![Step::Cached, remote(0, false), remote(1, false)]);
        // Not held for this answer (stale, evicted): read over the copy.
        assert_eq!(plan(Hot::Missed { whole: true }, None), vec![remote(0, true), remote(1, true)]);
        // A replica here meanwhile: the cache is no candidate, the copy is read over.
        let here = list(vec![mem(ME)]);
        let known = Known { me: ME, our_disk: None, hot: Hot::Off };
        assert_eq!(read_plan_after(&here, known, Some(judged), None), vec![Step::Local(&here.replicas[0])]);
    }

    #[test]
    fn a_plan_after_an_early_read_is_kept_or_the_plan_without_it() {
        let l = list(vec![mem("b:1"), disk(OUR_DISK)]);
        let known = Known { me: ME, our_disk: Some(OUR_DISK), hot: Hot::Missed { whole: true } };
        assert_eq!(read_plan_after(&l, known, Some(Verdict::Stands), None), vec![Step::Kept]);
        assert_eq!(read_plan_after(&l, known, Some(Verdict::Falls), None), read_plan(&l, known));
        assert_eq!(read_plan_after(&l, known, None, None), read_plan(&l, known));
    }

    #[test]
    fn hits_are_copied_early_from_a_mebibyte() {
        assert!(worth_copying_early(EARLY_COPY_FROM));
        assert!(!worth_copying_early(EARLY_COPY_FROM - 1));
    }

    #[test]
    fn a_failed_source_hands_on_unless_the_caller_or_the_lease_is_to_blame() {
        assert!(try_next(&StoreError::peer_gone("k", crate::error::PeerFault::NoReplica)));
        assert!(try_next(&StoreError::Disk("gone".into())));
        assert!(!try_next(&StoreError::BufferTooSmall { key: "k".into(), need: 2, have: 1 }));
        assert!(!try_next(&StoreError::LeaseExpired { key: "k".into(), lease_ms: 1, took_ms: 2 }));
    }

    #[test]
    fn write_plans_split_local_and_remote_replicas() {
        let replicas = vec![mem("b:1"), mem(ME), mem("c:1")];
        let plan = write_plan(&replicas, ME);
        assert_eq!(plan.local, vec![&replicas[1]]);
        assert_eq!(plan.remote, vec![&replicas[0], &replicas[2]]);
        assert_eq!(write_plan(&[], ME), WritePlan::default());
    }

    fn written() -> Vec<Written> {
        vec![
            Written::Done,
            Written::Refused(StoreError::AlreadyExists("b".into())),
            Written::Failed(StoreError::Internal("batch ended with a pending request".into())),
            Written::Failed(StoreError::peer_gone("d", crate::error::PeerFault::NoReplica)),
            Written::Failed(StoreError::Disk("x".into())),
            Written::Done,
            Written::Refused(StoreError::NoSpace { size: 10, replicas: 1, detail: String::new() }),
        ]
    }

    #[test]
    fn every_started_put_that_failed_is_revoked_whatever_the_error() {
        let (settled, _) = settle(written(), Mode::Put);
        assert_eq!((settled.commit, settled.revoke), (vec![0, 5], vec![2, 3, 4]));
    }

    #[test]
    fn a_put_of_an_existing_key_succeeds_and_an_upsert_replaces_it() {
        let (settled, results) = settle(written(), Mode::Put);
        assert!(settled.replace.is_empty());
        assert!(results[1].is_ok(), "{:?}", results[1]);
        assert!(matches!(results[6], Err(StoreError::NoSpace { .. })));
        assert!(matches!(results[2], Err(StoreError::Internal(_))));

        let (settled, results) = settle(written(), Mode::Upsert);
        assert_eq!(settled, Settled { commit: vec![0, 5], revoke: vec![2, 3, 4], replace: vec![1] });
        assert!(matches!(results[1], Err(StoreError::AlreadyExists(_))));
        assert!(matches!(results[6], Err(StoreError::NoSpace { .. })));
    }
}
