//! Writes: the executor's side of a put. The master has placed the value; its bytes go to
//! each replica of the write plan ([`plan::write_plan`]): this client's own by memcpy, the
//! others through the engine (registered memory directly, byte values through the staging
//! buffer).

use crescent_engine::{Opcode, TransferRequest};

use super::exec::Exec;
use super::plan;
use super::sg::{Extent, Reach, Src};
use crate::error::{Result, StoreError};
use crate::proto::ReplicaDescriptor;
use crate::staging::StagingBlock;

impl<'c> Exec<'c> {
    /// Writes a put's value to the replicas the master placed it on (a byte value through the
    /// staging buffer, starting with `first_piece` when it was staged). Returns whether every
    /// replica was this client's own.
    pub(crate) fn write(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        src: &Src<'_>,
        mut first_piece: Option<StagingBlock<'c>>,
    ) -> Result<bool> {
        let len = src.len();
        let plan = plan::write_plan(replicas, self.engine.segment_name());
        self.write_local(key, &plan.local, src)?;
        if plan.remote.is_empty() {
            return Ok(true);
        }
        let targets = plan
            .remote
            .iter()
            .map(|r| Ok((self.open(key, &r.segment_name)?, r.address)))
            .collect::<Result<Vec<_>>>()?;
        let write = |source: u64, seg, at: u64, length: u64| TransferRequest {
            opcode: Opcode::Write,
            source,
            target: seg,
            target_offset: at,
            length,
        };
        match src {
            Src::Registered(..) => self.transfer(
                key,
                targets.iter().flat_map(|&(seg, at)| {
                    src.registered_pieces().map(move |(addr, off, n)| write(addr, seg, at + off, n))
                }),
            )?,
            Src::Bytes(_) | Src::Parts(_) => {
                let mut off = 0;
                while off < len {
                    // The first piece may have been staged while the master placed the value.
                    let block = match first_piece.take() {
                        Some(staged) => staged,
                        None => {
                            let mut block = self.stage(len - off)?;
                            src.copy_to(off, block.bytes())?;
                            block
                        }
                    };
                    let n = block.len();
                    let from = block.addr();
                    self.transfer(key, targets.iter().map(|&(seg, at)| write(from, seg, at + off, n)))?;
                    off += n;
                }
            }
        }
        Ok(false)
    }

    /// The first piece of a byte put, copied into the staging buffer (before the master has
    /// answered); none for a value in registered memory.
    pub(crate) fn stage_first_piece(&self, src: &Src<'_>) -> Result<Option<StagingBlock<'c>>> {
        if !src.is_plain() {
            return Ok(None);
        }
        let mut block = self.stage(src.len())?;
        src.copy_to(0, block.bytes())?;
        Ok(Some(block))
    }

    /// Copies the value into this client's own replicas (from device memory by the device's
    /// copies).
    fn write_local(&self, key: &str, local: &[&ReplicaDescriptor], src: &Src<'_>) -> Result<()> {
        for r in local {
            let dst = self
                .local_replica(r, src.len())
                .ok_or_else(|| StoreError::Internal(format!("replica of {key:?} outside this client's segment")))?;
            src.copy_to(0, dst)?;
        }
        Ok(())
    }

    /// Writes a batch of puts: `placed[i]` holds key `i`'s replicas, `results[i]` what became of
    /// it (keys whose result is an error already were refused and are left alone). Values in
    /// registered memory move in one engine batch, byte values one after another while it
    /// runs. Returns whether every replica was this client's own.
    pub(crate) fn write_batch(
        &self,
        keys: &[String],
        placed: &[&[ReplicaDescriptor]],
        srcs: &[Src<'_>],
        results: &mut [Result<()>],
    ) -> Result<bool> {
        let me = self.engine.segment_name();
        let (mut requests, mut owner, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..keys.len() {
            if results[i].is_err() {
                continue;
            }
            let plan = plan::write_plan(placed[i], me);
            if let Err(e) = self.write_local(&keys[i], &plan.local, &srcs[i]) {
                results[i] = Err(e);
                continue;
            }
            if plan.remote.is_empty() {
                continue;
            }
            if srcs[i].is_plain() {
                bytes.push(i);
                continue;
            }
            for r in plan.remote {
                match self.open(&keys[i], &r.segment_name) {
                    Ok(seg) => {
                        for (addr, off, n) in srcs[i].registered_pieces() {
                            requests.push(TransferRequest {
                                opcode: Opcode::Write,
                                source: addr,
                                target: seg,
                                target_offset: r.address + off,
                                length: n,
                            });
                            owner.push(i);
                        }
                    }
                    Err(e) => results[i] = Err(e),
                }
            }
        }
        let all_local = requests.is_empty() && bytes.is_empty();
        let batch = self.start_batch(&requests)?;
        for &i in &bytes {
            // Only the remote replicas are left to write (ours got their copy above).
            let remote: Vec<ReplicaDescriptor> = placed[i].iter().filter(|r| r.segment_name != me).cloned().collect();
            if let Err(e) = self.write(&keys[i], &remote, &srcs[i], None) {
                results[i] = Err(e);
            }
        }
        self.finish_batch(batch, keys, &owner, results)?;
        Ok(all_local)
    }

    /// A put session's ranged writes (see [`super::session`]): for each key whose result is
    /// still Ok, each range of `ranges[i]` — `[offset, +len)` of the value, from registered
    /// memory at `addr` — into every replica the master placed the value on (`placed[i]`, for a
    /// value of `sizes[i]` bytes; the ranges were checked inside it): this client's own by
    /// memcpy, the others in one engine batch. A failure fails its key (the first is kept).
    pub(crate) fn write_ranges(
        &self,
        keys: &[String],
        placed: &[&[ReplicaDescriptor]],
        sizes: &[u64],
        ranges: &[&[Extent]],
        results: &mut [Result<()>],
    ) -> Result<()> {
        let me = self.engine.segment_name();
        let (mut requests, mut owner) = (Vec::new(), Vec::new());
        for i in 0..keys.len() {
            if results[i].is_err() {
                continue;
            }
            let plan = plan::write_plan(placed[i], me);
            let reach = Reach::of(self.engine, ranges[i].iter().map(|e| (e.addr, e.len)));
            for r in &plan.local {
                let Some(dst) = self.local_replica(r, sizes[i]) else {
                    results[i] =
                        Err(StoreError::Internal(format!("replica of {:?} outside this client's segment", keys[i])));
                    break;
                };
                for e in ranges[i].iter().filter(|e| e.len > 0) {
                    // The caller registered [addr, +len) (checked before the write started)
                    // and keeps it valid and unchanged for the call.
                    if let Err(err) = reach.read(e.addr, &mut dst[e.offset as usize..(e.offset + e.len) as usize]) {
                        results[i] = Err(err);
                        break;
                    }
                }
            }
            if results[i].is_err() {
                continue;
            }
            for r in plan.remote {
                match self.open(&keys[i], &r.segment_name) {
                    Ok(seg) => {
                        for e in ranges[i].iter().filter(|e| e.len > 0) {
                            requests.push(TransferRequest {
                                opcode: Opcode::Write,
                                source: e.addr,
                                target: seg,
                                target_offset: r.address + e.offset,
                                length: e.len,
                            });
                            owner.push(i);
                        }
                    }
                    Err(e) => {
                        results[i] = Err(e);
                        break;
                    }
                }
            }
        }
        let batch = self.start_batch(&requests)?;
        self.finish_batch(batch, keys, &owner, results)
    }
}
