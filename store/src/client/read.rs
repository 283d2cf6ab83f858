//! Reads: the executor's side of a get. One key's read runs its plan ([`plan::read_plan`])
//! source by source into its destination; a batch runs every key's first source together (the
//! remote reads in one engine batch) and the rest of a key's plan only where its first source
//! failed.
//!
//! An early read ([`plan::Early`]) is the executor's too: [`Exec::read_early`] reads from a
//! source chosen before the master answers ([`Speculative`]) while the caller asks the master,
//! [`Exec::early_answered`] counts what the answer made of it, and the plan the read then runs
//! starts with [`Step::Kept`] where it served the read.

use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use crescent_engine::{BatchId, Opcode, TransferEngine, TransferRequest, TransferStatus};

use super::exec::Exec;
use super::hot_cache::{self, Fill, Guard, HotCache, Miss};
use super::lease::Listed;
use super::plan::{self, Early, Hot, Known, Step, Verdict};
use super::sg::{raw_out, spans, Dst};
use crate::error::{PeerFault, Result, StoreError};
use crate::proto::ReplicaDescriptor;

/// Piece of a byte get staged at a time (two are in flight).
const STAGED_GET_PIECE: u64 = 2 << 20;

/// Piece a byte get with the cache lands at a time (see [`Exec::land`]); the deferred filler
/// reads in the same pieces.
const LAND_PIECE: u64 = hot_cache::FILL_PIECE;

/// One key's plan, with the hot cache's entry it holds on a hit.
struct Planned<'l, 'c> {
    steps: Vec<Step<'l>>,
    guard: Option<Guard<'c>>,
}

/// The source of an early read, chosen from what this client knows before the master answers
/// (what the read read is a [`plan::Early`]).
pub(crate) enum Speculative<'c> {
    /// The hot cache's entry for the key, held while it is copied.
    HotCopy(Guard<'c>),
    /// This client's disk file of the key's `version`, of `size` bytes: the object's only copy
    /// when this client last looked.
    OwnDisk { version: u64, size: u64 },
}

impl Speculative<'_> {
    /// The size of the value the source holds: an early read's memory is made for it.
    pub(crate) fn size(&self) -> u64 {
        match self {
            Speculative::HotCopy(guard) => guard.size(),
            Speculative::OwnDisk { size, .. } => *size,
        }
    }

    /// Whether an early read from here goes into host memory that takes `bytes` of the value
    /// (`whole`: all of it, in one piece): a copy out of the cache when it copies enough to be
    /// worth the hand-off to the background runtime ([`plan::worth_copying_early`]), a file
    /// read only into one piece (the file is read whole, and checked whole).
    pub(crate) fn fits(&self, bytes: u64, whole: bool) -> bool {
        match self {
            Speculative::HotCopy(_) => plan::worth_copying_early(bytes),
            Speculative::OwnDisk { .. } => whole,
        }
    }
}

impl<'c> Exec<'c> {
    /// Plans the read of the object `list` describes after the early read `early`, if one was
    /// made: the answer judges it first; the hot cache is looked up unless it stands (`whole`:
    /// whether the read takes the whole value, which may then fill the cache).
    fn plan<'l>(
        &self,
        key: &str,
        list: &'l Listed,
        whole: impl FnOnce() -> bool,
        early: Option<&Early>,
    ) -> Planned<'l, 'c> {
        let me = self.engine.segment_name();
        let our_disk = self.disk.map(|d| d.segment_name());
        let verdict = early.map(|e| plan::verdict(e, list, our_disk));
        let (guard, hot) = match self.hot {
            // The early read is the read: nothing is read from the cache, so it is not asked.
            _ if verdict == Some(Verdict::Stands) => (None, Hot::Off),
            Some(cache) if plan::hot_candidate(list, me) => match cache.lookup(key, list) {
                Some(g) => (Some(g), Hot::Hit),
                None => (None, Hot::Missed { whole: whole() }),
            },
            Some(cache) => {
                cache.note_local_read();
                (None, Hot::Off)
            }
            None => (None, Hot::Off),
        };
        let held = guard.as_ref().map(|g| g.identity());
        let steps = plan::read_plan_after(list, Known { me, our_disk, hot }, verdict, held);
        Planned { steps, guard }
    }

    /// Reads the object `list` describes into `dst` (which fits inside it). Its plan starts
    /// with [`Step::Kept`] where an early read (the first of [`Exec::early`]) put the very
    /// object there already; an early read of another is written over as if it were not there.
    pub(crate) fn read(&self, key: &str, list: &Listed, dst: &mut Dst<'_>) -> Result<()> {
        let early = self.early.first().and_then(Option::as_ref);
        let planned = self.plan(key, list, || dst.covers(list.size), early);
        if planned.steps.first() == Some(&Step::Kept) {
            if let Some(guard) = &planned.guard {
                // A hot copy: it counts as the hit's.
                guard.confirm_early_copy(dst.extents().iter().map(|e| e.len).sum());
            }
            return Ok(());
        }
        if let (Some(cache), Some(Early::HotCopy(_))) = (self.hot, early) {
            cache.note_early_copies_wasted(1);
        }
        self.run(key, list, &planned, 0, dst)
    }

    /// The hot cache's entry for `key`, whatever object the master will say the key is: the
    /// source of an early copy.
    pub(crate) fn hot_entry(&self, key: &str) -> Option<Speculative<'c>> {
        self.hot?.peek(key).map(Speculative::HotCopy)
    }

    /// This client's disk file of `key` when it was, the last time this client looked, the
    /// object's only copy: the source of an early read (the round trip is then hidden behind
    /// the file read instead of before it).
    pub(crate) fn only_file(&self, key: &str) -> Option<Speculative<'c>> {
        let (version, size) = self.disk?.tier.only_copy(key)?;
        Some(Speculative::OwnDisk { version, size })
    }

    /// Reads from `source` into `dst` before the master's answer says what the key is (the
    /// caller runs it beside the master's call, `StoreClient::replica_list_beside`): `dst` is
    /// host memory for the value at the size `source` holds, whole for a file (see
    /// [`Speculative::fits`]). Returns what it read, for the answer to judge.
    pub(crate) fn read_early(&self, key: &str, source: &Speculative<'_>, dst: &mut Dst<'_>) -> Early {
        match source {
            Speculative::HotCopy(guard) => {
                copy_entry_early(guard, dst);
                Early::HotCopy(guard.identity().clone())
            }
            &Speculative::OwnDisk { version, size } => {
                let read = match (self.disk, whole_slice(dst, size)) {
                    (Some(disk), Some(out)) => disk.tier.read_local(key, version, out).is_ok(),
                    _ => false,
                };
                Early::OwnDisk { version, size, read }
            }
        }
    }

    /// What the master's answer (or its refusal) tells the source of the early read `early`,
    /// before the read. A disk read is counted, wasted unless it stands (a wasted one stops
    /// further early reads of its file), and a confirmed file the answer shows in memory too
    /// is no longer the only copy. A hot copy is judged by the read (against the cache's entry
    /// for the answer); one the master refused counts as wasted here, and where the master says
    /// the key is gone the stale entry goes, so that later gets do not copy it while they ask.
    pub(crate) fn early_answered(&self, key: &str, early: &Early, answer: std::result::Result<&Listed, &StoreError>) {
        match (early, answer) {
            (Early::HotCopy(_), Ok(_)) => {}
            (Early::HotCopy(_), Err(e)) => {
                if let Some(cache) = self.hot {
                    cache.note_early_copies_wasted(1);
                    forget_if_gone(cache, key, e);
                }
            }
            (&Early::OwnDisk { version, .. }, answer) => {
                let Some(disk) = self.disk else { return };
                let our_disk = Some(disk.segment_name());
                let stands = answer.ok().filter(|l| plan::verdict(early, l, our_disk) == Verdict::Stands);
                disk.tier.early_read_judged(key, version, stands.is_some());
                if stands.is_some_and(|l| plan::held_in_memory(l)) {
                    // Back in memory meanwhile: later gets read it from there.
                    disk.tier.note_only_copy(key, version, false);
                }
            }
        }
    }

    /// With checksums on ([`Exec::verify`]), checks the bytes a read of the object `list`
    /// describes wrote into `dst` (all of them: the caller's read succeeded) against the
    /// object's checksum; a whole-value read that does not match fails.
    fn verified(&self, key: &str, list: &Listed, dst: &mut Dst<'_>) -> Result<()> {
        match self.verify {
            Some(checks) => checks.verify(key, list.checksum.map(|c| c.crc32), list.size, dst),
            None => Ok(()),
        }
    }

    /// A fill the deferred filler will make: with checksums on, it checks the blocks before
    /// entering them (the get's own read is checked apart).
    fn verifying(&self, mut fill: Fill, list: &Listed) -> Fill {
        if let (Some(checks), Some(c)) = (self.verify, list.checksum) {
            fill.verify_with(c.crc32, checks.clone());
        }
        fill
    }

    /// Tries the plan's sources from `from` on until one serves the read.
    fn run(&self, key: &str, list: &Listed, planned: &Planned<'_, '_>, from: usize, dst: &mut Dst<'_>) -> Result<()> {
        let mut last_err = None;
        for step in planned.steps.iter().skip(from) {
            match self.read_from(key, list, *step, planned.guard.as_ref(), dst) {
                Ok(()) => return Ok(()),
                Err(e) if !plan::try_next(&e) => return Err(e),
                Err(e) => {
                    tracing::debug!("reading {key:?} from {step:?}: {e}; trying the next source");
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| StoreError::peer_gone(key, PeerFault::NoReplica)))
    }

    fn read_from(
        &self,
        key: &str,
        list: &Listed,
        step: Step<'_>,
        guard: Option<&Guard<'_>>,
        dst: &mut Dst<'_>,
    ) -> Result<()> {
        match step {
            Step::Kept => Ok(()),
            Step::Cached => {
                let guard = guard.ok_or_else(|| StoreError::Internal("a cache hit without its entry".into()))?;
                copy_entry(guard, dst)
            }
            Step::Local(r) => {
                let src = self
                    .local_replica(r, list.size)
                    .ok_or_else(|| StoreError::Internal(format!("replica of {key:?} outside this client's segment")))?;
                dst.write_at(0, src)?;
                list.lease_held(key)?;
                self.verified(key, list, dst)
            }
            Step::Remote { replica, fill } => self.read_remote(key, list, replica, fill, dst),
            Step::OwnDisk => {
                self.read_own_disk(key, list, dst)?;
                self.verified(key, list, dst)
            }
            Step::RemoteDisk(r) => {
                self.read_remote_disk(key, r, list, dst)?;
                self.verified(key, list, dst)
            }
        }
    }

    /// Reads a remote replica. With the cache (`fill`), deferred mode: read as without the
    /// cache, then hand the fill to the filler. Inline mode (or a deferred fill this get took
    /// over): a byte get lands the bytes in blocks reserved for the fill and copies them to
    /// the caller from there (in place of the staging buffer); a get into registered memory
    /// reads there and copies from there into the blocks. A get of an object another get (or
    /// the filler) is fetching waits for that fetch instead. A read that ends after the list's
    /// lease fails and fills nothing (see [`super::lease`]).
    fn read_remote(
        &self,
        key: &str,
        list: &Listed,
        r: &ReplicaDescriptor,
        fill: bool,
        dst: &mut Dst<'_>,
    ) -> Result<()> {
        let Some(cache) = self.hot.filter(|_| fill) else {
            self.read_replica(key, r, dst)?;
            list.lease_held(key)?;
            return self.verified(key, list, dst);
        };
        match cache.begin(key, list, r) {
            Miss::Defer(fill) => {
                let started = Instant::now();
                self.read_replica(key, r, dst)?; // on failure the fill's blocks go back
                cache.note_read(list.size, started.elapsed());
                list.lease_held(key)?;
                self.verified(key, list, dst)?;
                cache.defer(self.verifying(fill, list), list.lease_end());
                Ok(())
            }
            Miss::Lead(mut fill) => {
                let started = Instant::now();
                let landed = match &mut *dst {
                    Dst::Bytes { out, offset: 0 } if out.len() as u64 == list.size => {
                        self.land(key, r, &fill, out)?;
                        true
                    }
                    dst => {
                        self.read_replica(key, r, dst)?;
                        false
                    }
                };
                cache.note_read(list.size, started.elapsed());
                if !landed {
                    dst.landed(|off, bytes| fill.copy_range_from(off, bytes))?;
                }
                list.lease_held(key)?; // on failure the fill's blocks go back
                                       // What the fill holds is what `dst` holds: unverified bytes never enter.
                self.verified(key, list, dst)?;
                cache.publish(fill);
                Ok(())
            }
            // Entries were checked when filled (with checksums on).
            Miss::Join(joined) => match cache.wait(joined) {
                Some(guard) => copy_entry(&guard, dst),
                None => {
                    self.read_replica(key, r, dst)?;
                    list.lease_held(key)?;
                    self.verified(key, list, dst)
                }
            },
            Miss::Skip => {
                self.read_replica(key, r, dst)?;
                list.lease_held(key)?;
                self.verified(key, list, dst)
            }
        }
    }

    /// Reads what `dst` takes of a remote replica `r` (no lease check: the caller's).
    pub(crate) fn read_replica(&self, key: &str, r: &ReplicaDescriptor, dst: &mut Dst<'_>) -> Result<()> {
        let _foreground = self.hot.map(HotCache::foreground); // the filler waits meanwhile
        let seg = self.open(key, &r.segment_name)?;
        let read = |local: u64, at: u64, n: u64| TransferRequest {
            opcode: Opcode::Read,
            source: local,
            target: seg,
            target_offset: r.address + at,
            length: n,
        };
        match dst {
            Dst::Registered(extents, _) => self.transfer(key, extents.iter().map(|e| read(e.addr, e.offset, e.len))),
            Dst::Bytes { out: [], .. } => Ok(()),
            Dst::Bytes { out, offset } => {
                let (offset, size) = (*offset, out.len() as u64);
                // Where the transport needs no registration (tcp, shm), straight into the
                // caller's bytes in one transfer, as a zero-copy get.
                // (Memory the caller registered overlapping these bytes, a caller's mistake,
                // makes the loan fail: then the staged path below.)
                let at = out.as_mut_ptr() as u64;
                match self.engine.lend_local(Some(seg), at, size) {
                    // The loan ends once the transfer has (it is dropped after it).
                    Ok(Some(_loan)) => {
                        let id = self
                            .engine
                            .transfer_start(&[read(at, offset, size)])
                            .map_err(|e| self.transfer_error(key, e))?;
                        // While it moves, this thread (otherwise idle) makes the fresh pages
                        // present, one call for all instead of a fault per page inside the
                        // receiving threads' copies (see `value_buffer::populate`).
                        hot_cache::value_buffer::populate(at as *const u8, size as usize);
                        return self.engine.transfer_finish(id).map_err(|e| self.transfer_error(key, e));
                    }
                    Ok(None) => {}
                    Err(e) => tracing::debug!("reading {key:?} through the staging buffer: {e}"),
                }
                // Through the staging buffer in pieces, two in flight: the next piece moves
                // while the last one is copied out (the copy into fresh memory, page faults
                // included, costs about as much as the transfer).
                let piece = STAGED_GET_PIECE.min(self.staging.chunk());
                let mut off = 0;
                // Dropped on an early return: waits for its transfer before its block goes back.
                let mut previous: Option<InFlight<'_>> = None;
                while off < size {
                    // The second block only if it is free now: a thread waiting for a second
                    // block while holding one could wait forever on others doing the same.
                    let block = match previous {
                        None => Some(self.stage((size - off).min(piece))?),
                        Some(_) => self.staging.try_acquire((size - off).min(piece)),
                    };
                    let Some(block) = block else {
                        self.finish_staged(key, previous.take().expect("a piece is in flight"), out)?;
                        continue;
                    };
                    let n = block.len();
                    let id = self.engine.transfer_start(&[read(block.addr(), offset + off, n)]);
                    let next = InFlight {
                        engine: self.engine,
                        id: Some(id.map_err(|e| self.transfer_error(key, e))?),
                        block,
                        off,
                    };
                    if let Some(done) = previous.replace(next) {
                        self.finish_staged(key, done, out)?;
                    }
                    off += n;
                }
                if let Some(done) = previous {
                    self.finish_staged(key, done, out)?;
                }
                Ok(())
            }
        }
    }

    /// Waits for a staged piece of a get and copies it to its place in `out`.
    fn finish_staged(&self, key: &str, mut piece: InFlight<'_>, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let id = piece.id.take().expect("finished once");
        self.engine.transfer_finish(id).map_err(|e| self.transfer_error(key, e))?;
        let (off, n) = (piece.off as usize, piece.block.len() as usize);
        out[off..off + n].write_copy_of_slice(piece.block.bytes());
        Ok(())
    }

    /// Reads the replica into the fill's blocks and copies it to `out` as it arrives: every
    /// piece is started at once, and each is copied out while the later ones still move (as
    /// the staged get without the cache overlaps its copies), so that only the last piece's
    /// copy adds to the get.
    fn land(&self, key: &str, r: &ReplicaDescriptor, fill: &Fill, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let _foreground = self.hot.map(HotCache::foreground); // the filler waits meanwhile
        let seg = self.open(key, &r.segment_name)?;
        let mut landing = Landing { engine: self.engine, pieces: VecDeque::new() };
        for (off, addr, n) in fill.chunks(LAND_PIECE) {
            let request = TransferRequest {
                opcode: Opcode::Read,
                source: addr,
                target: seg,
                target_offset: r.address + off,
                length: n,
            };
            let id = self.engine.transfer_start(&[request]).map_err(|e| self.transfer_error(key, e))?;
            landing.pieces.push_back((id, off, n));
        }
        // While the first pieces move, this thread (otherwise idle) makes the result's fresh
        // pages present, one call for all instead of a fault per page inside the copies out
        // (see `value_buffer::populate`).
        hot_cache::value_buffer::populate(out.as_ptr() as *const u8, out.len());
        while let Some((id, off, n)) = landing.pieces.pop_front() {
            self.engine.transfer_finish(id).map_err(|e| self.transfer_error(key, e))?;
            fill.copy_range_to(off, &mut out[off as usize..(off + n) as usize]);
        }
        Ok(())
    }

    /// Reads this client's own disk file of the object.
    fn read_own_disk(&self, key: &str, list: &Listed, dst: &mut Dst<'_>) -> Result<()> {
        let disk = self.disk.ok_or_else(|| StoreError::Internal("a disk read without a disk tier".into()))?;
        match whole_slice(dst, list.size) {
            Some(out) => disk.tier.read_local(key, list.version, out)?,
            None => {
                // Ranges or pieces: the file is read whole (it is checked against its checksum
                // whole) and the parts wanted copied out.
                let mut value = vec![0u8; list.size as usize];
                disk.tier.read_local(key, list.version, &mut value)?;
                dst.write_at(0, &value)?;
            }
        }
        // The next get of it reads the file while it asks the master.
        disk.tier.note_only_copy(key, list.version, true);
        Ok(())
    }

    /// Reads another client's file through its disk service: it stages pieces in its
    /// registered memory and we read them with the engine.
    fn read_remote_disk(&self, key: &str, r: &ReplicaDescriptor, list: &Listed, dst: &mut Dst<'_>) -> Result<()> {
        let (version, size) = (list.version, list.size);
        self.remote_disk_reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (mut reader, segment) =
            super::disk::service::DiskReader::open(&r.disk_service, self.engine.auth(), key, version, size)?;
        let seg = self.open(key, &segment)?;
        let read = |to: u64, at: u64, n: u64| TransferRequest {
            opcode: Opcode::Read,
            source: to,
            target: seg,
            target_offset: at,
            length: n,
        };
        let mut off = 0u64;
        let mut confirmed = false;
        while off < size {
            let piece = match dst {
                Dst::Registered(extents, _) => {
                    let p = reader.next(size - off)?;
                    self.transfer(key, spans(extents, off, p.len).map(|(to, at, n)| read(to, p.addr + at - off, n)))?;
                    p
                }
                Dst::Bytes { .. } => {
                    let mut block = self.stage(size - off)?;
                    let p = reader.next(block.len())?;
                    self.transfer(key, std::iter::once(read(block.addr(), p.addr, p.len)))?;
                    dst.write_at(off, &block.bytes()[..p.len as usize])?;
                    p
                }
            };
            off += piece.len;
            confirmed = piece.last;
            if piece.last != (off == size) {
                return Err(StoreError::Disk(format!("the owner of {key:?} ended its pieces at {off} of {size}")));
            }
        }
        if !confirmed {
            return Err(StoreError::Disk(format!("the owner of {key:?} did not confirm the checksum")));
        }
        Ok(())
    }

    /// Reads many keys: `lists` holds the master's answer per key, `dsts` where each goes, and
    /// `results` what became of each: keys whose result is an error already (refused by the
    /// master, a bad destination) are left alone. `fresh`: the destinations are newly
    /// allocated, so a hit's destination is populated before its copy (see
    /// [`hot_cache::value_buffer`]).
    ///
    /// Every key's first source runs together: hits are copied out and local replicas
    /// memcpy'd while the remote reads move in one engine batch; misses fill the cache from
    /// the bytes their transfer brought as soon as it ended; a key another get is fetching
    /// waits for that fetch after this batch's own fills are published (so two batches
    /// waiting for each other's keys never wait forever). A key whose first source failed
    /// tries the rest of its plan; one whose first source is a disk file reads it then.
    pub(crate) fn read_batch(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        dsts: &mut [Option<Dst<'_>>],
        results: &mut [Result<()>],
        fresh: bool,
    ) -> Result<()> {
        let n = keys.len();
        let mut plans: Vec<Option<Planned<'_, 'c>>> = (0..n).map(|_| None).collect();
        let (mut requests, mut owner) = (Vec::new(), Vec::new());
        // The requests of each key in the batch (they are next to each other).
        let mut requests_of: Vec<std::ops::Range<usize>> = vec![0..0; n];
        let (mut hits, mut fills, mut joins, mut batched, mut later) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut deferred = Vec::new();
        // Hot copies made early that the answers confirmed.
        let mut confirmed = 0;
        for i in 0..n {
            let (Some(list), Some(dst), Ok(())) = (&lists[i], dsts[i].as_mut(), &results[i]) else { continue };
            let planned =
                self.plan(&keys[i], list, || dst.covers(list.size), self.early.get(i).and_then(Option::as_ref));
            match (planned.steps.first().copied(), &mut *dst) {
                (Some(Step::Kept), _) => {
                    // Copied while the master answered, from this very object: nothing to do.
                    if let Some(guard) = &planned.guard {
                        guard.confirm_early_copy(dst.extents().iter().map(|e| e.len).sum());
                        confirmed += 1;
                    }
                }
                (Some(Step::Cached), _) => hits.push(i),
                (Some(Step::Local(_)), _) => {
                    let first = self.read_from(&keys[i], list, planned.steps[0], None, dst);
                    if let Err(e) = first {
                        results[i] = Err(e);
                        later.push((i, 1));
                    }
                }
                (Some(Step::Remote { replica, fill }), Dst::Registered(extents, _)) => {
                    let mut transfer = true;
                    if let (Some(cache), true) = (self.hot, fill) {
                        match cache.begin(&keys[i], list, replica) {
                            Miss::Lead(f) => fills.push((i, f)),
                            Miss::Defer(f) => deferred.push((i, f)),
                            Miss::Join(joined) => {
                                joins.push((i, joined));
                                transfer = false;
                            }
                            Miss::Skip => {}
                        }
                    }
                    if transfer {
                        match self.open(&keys[i], &replica.segment_name) {
                            Ok(seg) => {
                                let first = requests.len();
                                for e in extents.iter() {
                                    requests.push(TransferRequest {
                                        opcode: Opcode::Read,
                                        source: e.addr,
                                        target: seg,
                                        target_offset: replica.address + e.offset,
                                        length: e.len,
                                    });
                                    owner.push(i);
                                }
                                requests_of[i] = first..requests.len();
                                batched.push(i);
                            }
                            Err(e) => {
                                results[i] = Err(e);
                                later.push((i, 1));
                            }
                        }
                    }
                }
                // Byte destinations without a loan, disk files, or nothing to read: one by one.
                _ => later.push((i, 0)),
            }
            plans[i] = Some(planned);
        }
        // The filler waits while this batch's transfers move.
        let foreground = self.hot.filter(|_| !requests.is_empty()).map(HotCache::foreground);
        let started = Instant::now();
        let batch = self.start_batch(&requests)?;
        for &i in &hits {
            let guard = plans[i].as_ref().and_then(|p| p.guard.as_ref()).expect("a hit holds its entry");
            let dst = dsts[i].as_mut().expect("planned");
            if fresh {
                // Fresh destinations are the client's own host memory, never a device's.
                if let Dst::Registered(extents, reach) = dst {
                    for e in extents.iter().filter(|_| !reach.has_device()) {
                        hot_cache::value_buffer::populate(e.addr as *const u8, e.len as usize);
                    }
                }
            }
            if let Err(e) = copy_entry(guard, dst) {
                results[i] = Err(e);
            }
        }
        if let Some(cache) = self.hot {
            // An early copy the answer did not confirm is written over by the read planned from
            // the answer (or its key fails, as it would have without the copy). Those of keys
            // the master refused were counted then ([`Exec::early_answered`]).
            let copied =
                self.early.iter().zip(lists).filter(|(e, l)| matches!(e, Some(Early::HotCopy(_))) && l.is_some());
            cache.note_early_copies_wasted((copied.count() - confirmed) as u64);
        }
        // With checksums on: the keys checked before their fill was published, and how it went.
        let mut checked: Vec<Option<Result<()>>> = (0..n).map(|_| None).collect();
        match (self.hot, batch) {
            (Some(cache), Some(id)) => {
                self.fill_as_transfers_end(cache, id, &requests_of, fills, dsts, (keys, lists), &mut checked)
            }
            // Fills without a transfer go back before anyone waits for them.
            _ => drop(fills),
        }
        self.finish_batch(batch, keys, &owner, results)?;
        drop(foreground);
        if let (Some(cache), false) = (self.hot, requests.is_empty()) {
            // The batch's reads as one, for the auto fill's choice (see `hot_cache::fill_choice`).
            cache.note_read(requests.iter().map(|r| r.length).sum(), started.elapsed());
        }
        // A read that ended after the lease may hold another object's bytes (see [`super::lease`]).
        for &i in &batched {
            if let (Ok(()), Some(list)) = (&results[i], &lists[i]) {
                results[i] = list.lease_held(&keys[i]);
            }
            if let (Ok(()), Some(list), Some(dst)) = (&results[i], &lists[i], dsts[i].as_mut()) {
                results[i] = match checked[i].take() {
                    Some(verdict) => verdict,
                    None => self.verified(&keys[i], list, dst),
                };
            }
            if results[i].as_ref().is_err_and(plan::try_next) {
                later.push((i, 1));
            }
        }
        // Misses read within their lease hand their fills to the filler (before this batch
        // waits for any fetch: a key twice in the batch waits for the first one's fill).
        if let Some(cache) = self.hot {
            for (i, fill) in deferred {
                if let (Ok(()), Some(list)) = (&results[i], &lists[i]) {
                    cache.defer(self.verifying(fill, list), list.lease_end());
                } // else dropped: its blocks go back
            }
        }
        if let Some(cache) = self.hot {
            for (i, joined) in joins {
                if let Some(guard) = cache.wait(joined) {
                    if let Err(e) = copy_entry(&guard, dsts[i].as_mut().expect("planned")) {
                        results[i] = Err(e);
                    }
                } else {
                    later.push((i, 0));
                }
            }
        }
        // The rest of each plan that needs it, one key after another.
        for (i, from) in later {
            let (Some(list), Some(planned), Some(dst)) = (&lists[i], &plans[i], dsts[i].as_mut()) else { continue };
            let retried = self.run(&keys[i], list, planned, from, dst);
            results[i] = match (retried, std::mem::replace(&mut results[i], Ok(()))) {
                (Ok(()), _) => Ok(()),
                // Nothing else to try: the first source's error says more.
                (Err(StoreError::PeerGone { cause: PeerFault::NoReplica, .. }), Err(first)) => Err(first),
                (Err(e), _) => Err(e),
            };
        }
        Ok(())
    }

    /// Fills the cache from each miss of a running batch as soon as its own transfers have
    /// completed, while the others still move. A fill whose transfer failed (or that has none)
    /// is dropped: its blocks go back and the gets waiting for it read for themselves. So is
    /// one whose read ended after its lease, and, with checksums on, one whose bytes do not
    /// match (each checked key's verdict goes to `checked`, for the get's own result).
    #[allow(clippy::too_many_arguments)]
    fn fill_as_transfers_end(
        &self,
        cache: &HotCache,
        batch: BatchId,
        requests_of: &[std::ops::Range<usize>],
        fills: Vec<(usize, Fill)>,
        dsts: &mut [Option<Dst<'_>>],
        (keys, lists): (&[String], &[Option<Listed>]),
        checked: &mut [Option<Result<()>>],
    ) {
        let mut waiting: Vec<(usize, Fill)> = fills;
        while !waiting.is_empty() {
            let Ok(statuses) = self.engine.batch_status(batch) else { return };
            let mut pending = Vec::with_capacity(waiting.len());
            for (i, mut fill) in waiting {
                let mine = statuses.get(requests_of[i].clone()).unwrap_or_default();
                if mine.is_empty() {
                    continue; // no transfer of its own (not expected): dropped
                }
                if mine.contains(&TransferStatus::Pending) {
                    pending.push((i, fill));
                } else if mine.iter().all(|s| *s == TransferStatus::Completed)
                    && lists[i].as_ref().is_some_and(|l| l.lease_held(&keys[i]).is_ok())
                {
                    if let (Some(dst), Some(list)) = (dsts[i].as_mut(), lists[i].as_ref()) {
                        if self.verify.is_some() {
                            let verdict = self.verified(&keys[i], list, dst);
                            let ok = verdict.is_ok();
                            checked[i] = Some(verdict);
                            if !ok {
                                continue; // dropped: unverified bytes never enter
                            }
                        }
                        if let Err(e) = dst.landed(|off, bytes| fill.copy_range_from(off, bytes)) {
                            tracing::debug!("{:?}: not cached: {e}", keys[i]);
                            continue; // dropped: its blocks go back
                        }
                        cache.publish(fill);
                    }
                } // else failed, or ended after the lease: dropped
            }
            waiting = pending;
            if !waiting.is_empty() {
                // Returns early once every request has ended.
                let _ = self.engine.wait_batch(batch, Some(Duration::from_millis(1)));
            }
        }
    }
}

/// Copies what `dst` (host memory) takes of a cached object out of its entry, before the
/// master has confirmed that the entry still is the object (an early copy: see
/// [`HotCache::peek`]).
fn copy_entry_early(guard: &Guard<'_>, dst: &mut Dst<'_>) {
    match dst {
        Dst::Bytes { out, offset } => guard.copy_range_early(*offset, out),
        Dst::Registered(extents, _) => {
            for e in extents.iter() {
                // SAFETY: the caller's registered memory for this call (checked at the call's
                // entry); nothing else writes it during the get.
                guard.copy_range_early(e.offset, unsafe { raw_out(e.addr, e.len) });
            }
        }
    }
}

/// Drops the hot cache's entry for `key` when the master's answer `e` says the key is gone
/// (removed or evicted since the entry was filled), so that later gets of it do not copy the
/// stale entry while they ask.
fn forget_if_gone(cache: &HotCache, key: &str, e: &StoreError) {
    if matches!(e, StoreError::NotFound(_)) {
        cache.invalidate(key);
    }
}

/// Copies what `dst` takes of a cached object out of its entry (into device memory through
/// the host: the entry's bytes are copied out, then to the device).
fn copy_entry(guard: &Guard<'_>, dst: &mut Dst<'_>) -> Result<()> {
    if let Dst::Registered(extents, reach) = dst {
        if reach.has_device() {
            let mut host: Vec<u8> = Vec::new();
            for e in extents.iter() {
                host.resize(e.len as usize, 0);
                // SAFETY: the same layout; the copy writes only initialised bytes into it.
                guard.copy_range_to(e.offset, unsafe { &mut *(&mut host[..] as *mut [u8] as *mut [MaybeUninit<u8>]) });
                reach.write(e.addr, &host)?;
            }
            return Ok(());
        }
    }
    for e in dst.extents() {
        // SAFETY: `dst`'s memory: the caller's registered (or lent) host memory for this call,
        // or the caller's own bytes borrowed by `dst`; nothing else writes it during the get.
        guard.copy_range_to(e.offset, unsafe { raw_out(e.addr, e.len) });
    }
    Ok(())
}

/// The destination as one slice, when it takes the whole value `[0, size)` in one piece.
fn whole_slice<'d>(dst: &'d mut Dst<'_>, size: u64) -> Option<&'d mut [u8]> {
    // Device memory is never handed out as a slice: the CPU must not touch it.
    if !dst.whole_in_one(size) || dst.on_device() {
        return None;
    }
    match dst {
        Dst::Bytes { out, .. } => {
            // A file read wants initialised memory: zeroed first (on this path the disk costs
            // far more than the pass).
            out.fill(MaybeUninit::new(0));
            // SAFETY: every byte was just written.
            Some(unsafe { out.assume_init_mut() })
        }
        // SAFETY: the caller registered [addr, +len) for this call, and nothing else writes it
        // during the get (the slice lives no longer than the borrow of `dst`).
        Dst::Registered([e], _) => Some(unsafe { std::slice::from_raw_parts_mut(e.addr as *mut u8, e.len as usize) }),
        Dst::Registered(..) => None,
    }
}

/// A piece of a staged get whose transfer is in flight. Dropped unfinished (an error
/// elsewhere in the get), it waits for the transfer before its block goes back.
struct InFlight<'a> {
    engine: &'a TransferEngine,
    id: Option<BatchId>,
    block: crate::staging::StagingBlock<'a>,
    off: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.engine.transfer_finish(id);
        }
    }
}

/// The pieces of a landing still in flight: `(batch, offset in the object, length)`. Dropped
/// early (an error), it waits for them, so that the fill's blocks never go back while a
/// transfer still writes into them.
struct Landing<'a> {
    engine: &'a TransferEngine,
    pieces: VecDeque<(BatchId, u64, u64)>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        for (id, _, _) in self.pieces.drain(..) {
            let _ = self.engine.transfer_finish(id);
        }
    }
}
