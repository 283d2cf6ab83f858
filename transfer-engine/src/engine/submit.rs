//! Submitting a batch: each request checked and cut into slices, routed to the transport its
//! segment uses (device memory detoured where that transport cannot move it: rdma, where the
//! NICs have no GPUDirect registration of it), and handed over.

use std::sync::Arc;
use std::time::Instant;

use crescent_transports::device::Location;
use crescent_transports::{Completion, FailureReason, Opcode, Slice, TransportKind};

use super::{
    Route, Segment, SegmentId, TransferEngine, TransferRequest, FOLLOW_FIRST_WAIT, FOLLOW_LIMIT, FOLLOW_MAX_WAIT,
    FOLLOW_MIN_FETCH,
};
use crate::batch::{BatchId, Submission};
use crate::descriptor::BufferDescriptor;
use crate::error::{EngineError, Result};
use crate::slicing::{cut, CutError, Piece};

pub(super) enum PlanError {
    Local(String),
    NotRegistered { addr: u64, len: u64 },
    Remote(FailureReason),
}

impl TransferEngine {
    /// Submits requests into a batch (appended after those already submitted).
    ///
    /// A request whose local side is not registered memory is a caller error: nothing is
    /// submitted. A request outside the target's registered memory ends `Failed` with the reason.
    pub fn submit(&self, batch_id: BatchId, requests: &[TransferRequest]) -> Result<()> {
        let batch = self.batch(batch_id)?;
        // The requests' deadline counts from here: time spent waiting for a descriptor to
        // list a request's target (at most FOLLOW_LIMIT for the whole call) is part of it.
        let deadline = Instant::now() + self.config.transfer_timeout;
        let follow_until = deadline.min(Instant::now() + FOLLOW_LIMIT);
        let mut planned = Vec::with_capacity(requests.len());
        // Requests of a batch mostly go to one segment: looked up once per run of them.
        for (i, r) in requests.iter().enumerate() {
            let segment = match planned.last() {
                Some((id, s, _)) if *id == r.target => Arc::clone(s),
                _ => self.segment(r.target)?,
            };
            if r.length == 0 {
                return Err(EngineError::InvalidArgument(format!("request {i} has length 0")));
            }
            let pieces = match self.plan(&segment, r, follow_until) {
                Ok(p) => Ok(p),
                Err(PlanError::Local(msg)) => return Err(EngineError::InvalidArgument(format!("request {i}: {msg}"))),
                Err(PlanError::NotRegistered { addr, len }) => {
                    return Err(EngineError::LocalNotRegistered { request: i, addr, len })
                }
                Err(PlanError::Remote(msg)) => Err(msg),
            };
            planned.push((r.target, segment, pieces));
        }
        let base = batch.reserve(requests.len())?;
        let mut submission = Submission::new(batch.clone(), deadline);
        let mut outgoing: Vec<(usize, Opcode, Piece, usize)> = Vec::with_capacity(requests.len());
        let mut guards = Vec::new();
        for (i, ((_, _, pieces), r)) in planned.iter().zip(requests).enumerate() {
            let slot = base + i;
            let pieces = match pieces {
                Ok(p) => p,
                Err(reason) => {
                    batch.fail_request(slot, reason.clone());
                    continue;
                }
            };
            // One buffer for every request's guards (all or none of a request's are kept).
            guards.clear();
            let acquired = pieces.iter().try_for_each(|p| {
                guards.push(self.table.acquire_local(p.local_addr, p.len)?);
                Ok::<_, crescent_transports::TransportError>(())
            });
            match acquired {
                Ok(()) => {
                    batch.start_request(slot, pieces.len());
                    for (p, g) in pieces.iter().zip(guards.drain(..)) {
                        outgoing.push((i, r.opcode, *p, submission.add_slice(slot, g)));
                    }
                }
                Err(e) => {
                    guards.clear();
                    batch.fail_request(slot, FailureReason::local(e.to_string()));
                }
            }
        }
        let submission = Arc::new(submission);
        self.watchdog.watch(&submission);
        // Slices per segment, in the order segments first appear (mostly just one).
        let mut per_segment: Vec<(SegmentId, Vec<Slice>)> = Vec::new();
        for (i, opcode, p, slice) in outgoing {
            let target = requests[i].target;
            let at = match per_segment.iter().rposition(|(id, _)| *id == target) {
                Some(at) => at,
                None => {
                    per_segment.push((target, Vec::new()));
                    per_segment.len() - 1
                }
            };
            per_segment[at].1.push(Slice {
                opcode,
                local_addr: p.local_addr,
                remote_addr: p.remote_addr,
                len: p.len,
                completion: Completion::new(submission.clone(), slice),
            });
        }
        for (target, slices) in per_segment {
            let segment = &planned.iter().find(|(id, _, _)| *id == target).expect("a planned segment").1;
            let route = segment.route();
            let (slices, detour) = self.device_detour(segment, &route, slices);
            route.transport.submit(&route.endpoint, slices);
            if !detour.is_empty() {
                self.submit_over_tcp(segment, detour);
            }
        }
        Ok(())
    }

    /// Splits off the slices of an rdma route that touch device memory the NICs cannot reach
    /// on either end (not registered for GPUDirect RDMA: no rdma keys): they go over tcp,
    /// staged. Device memory registered for GPUDirect on both ends, or on one end with host
    /// memory on the other, stays on rdma.
    pub(super) fn device_detour(
        &self,
        segment: &Segment,
        route: &Route,
        slices: Vec<Slice>,
    ) -> (Vec<Slice>, Vec<Slice>) {
        if route.transport.kind() != TransportKind::Rdma {
            return (slices, Vec::new());
        }
        let descriptor = segment.descriptor.read().clone();
        // The common case, host memory on both ends, costs no look-up per slice.
        if !self.table.holds_device_memory() && !descriptor.buffers.iter().any(is_device) {
            return (slices, Vec::new());
        }
        slices.into_iter().partition(|s| {
            let local = self
                .table
                .find(s.local_addr, s.len)
                .map_or(End::HOST, |r| End { on_device: r.device().is_some(), nic_registered: r.has_rdma_keys() });
            let remote = descriptor
                .buffer_at(s.remote_addr)
                .map_or(End::HOST, |b| End { on_device: is_device(b), nic_registered: !b.keys.rdma.is_empty() });
            !must_stage(local, remote)
        })
    }

    /// Sends `slices` to `segment` over tcp (its descriptor's tcp endpoint).
    pub(super) fn submit_over_tcp(&self, segment: &Segment, slices: Vec<Slice>) {
        let tcp = self.transports.iter().find(|t| t.kind() == TransportKind::Tcp);
        let endpoint = segment.descriptor.read().endpoints.iter().find(|e| e.kind() == TransportKind::Tcp).cloned();
        match (tcp, endpoint) {
            (Some(tcp), Some(endpoint)) => tcp.submit(&endpoint, slices),
            _ => {
                let reason = FailureReason::local(format!(
                    "segment {}: device memory without GPUDirect RDMA moves over tcp, and it offers no tcp endpoint",
                    segment.name
                ));
                for s in slices {
                    s.completion.fail(reason.clone());
                }
            }
        }
    }

    /// Cuts `r` into pieces within the local and the target's registered memory. A target
    /// range that the cached descriptor does not list is looked up again, with growing waits,
    /// until `follow_until`: the owner may have registered it since the descriptor was read,
    /// or be registering it still (a segment opened as its owner starts). Only then does the
    /// request fail out of range. The target checks every access itself whatever this says.
    pub(super) fn plan(
        &self,
        segment: &Segment,
        r: &TransferRequest,
        follow_until: Instant,
    ) -> std::result::Result<Vec<Piece>, PlanError> {
        let max = segment.route.read().transport.slice_len_for(r.length);
        let local_end = |a: u64| self.table.end_of(a);
        let first_miss = Instant::now();
        let mut reads = 0u32;
        let mut wait = FOLLOW_FIRST_WAIT;
        let mut read_error = None;
        loop {
            let looked = Instant::now();
            let descriptor = segment.descriptor.read().clone();
            match cut(r.source, r.target_offset, r.length, max, local_end, |a| descriptor.buffer_end(a)) {
                Ok(pieces) => {
                    if reads > 0 {
                        tracing::debug!(
                            "segment {}: its descriptor lists [{:#x}, +{}) after {reads} read(s) again",
                            segment.name,
                            r.target_offset,
                            r.length
                        );
                    }
                    return Ok(pieces);
                }
                Err(CutError::Local { addr, len }) => return Err(PlanError::NotRegistered { addr, len }),
                Err(CutError::Remote { addr, len }) => {
                    let left = follow_until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let read_error = read_error.map(|e| format!("; reading it failed: {e}")).unwrap_or_default();
                        return Err(PlanError::Remote(FailureReason::out_of_range(format!(
                            "[{addr:#x}, +{len}) is outside the registered memory of segment {} (its descriptor, \
                             read again {reads} time(s) over {} ms, does not list it{read_error})",
                            segment.name,
                            first_miss.elapsed().as_millis()
                        ))));
                    }
                    if reads > 0 {
                        std::thread::sleep(wait.min(left));
                        wait = (wait * 2).min(FOLLOW_MAX_WAIT);
                    }
                    reads += 1;
                    let timeout = follow_until.saturating_duration_since(Instant::now()).max(FOLLOW_MIN_FETCH);
                    match self.refresh_segment(segment, looked, timeout.min(self.config.handshake_timeout)) {
                        Ok(()) => read_error = None,
                        Err(e) => {
                            tracing::debug!("segment {}: reading its descriptor again failed: {e}", segment.name);
                            read_error = Some(e.to_string());
                        }
                    }
                }
                Err(CutError::Empty) => return Err(PlanError::Local("empty request".into())),
            }
        }
    }
}

fn is_device(b: &BufferDescriptor) -> bool {
    matches!(b.location.parse(), Ok(Location::Cuda(_)))
}

/// One end of a slice, as far as rdma is concerned.
#[derive(Debug, Clone, Copy)]
struct End {
    /// Device memory.
    on_device: bool,
    /// Registered with the NICs (it has rdma keys).
    nic_registered: bool,
}

impl End {
    /// Host memory (also what an end not found is taken for: the transport reports it).
    const HOST: End = End { on_device: false, nic_registered: true };
}

/// Whether a slice of an rdma route must go over tcp, staged: either end is device memory that
/// the NICs cannot reach (no GPUDirect registration). Host memory is never staged for this.
fn must_stage(local: End, remote: End) -> bool {
    [local, remote].iter().any(|e| e.on_device && !e.nic_registered)
}

#[cfg(test)]
mod tests {
    use super::{must_stage, End};

    #[test]
    fn only_device_memory_without_nic_keys_is_staged() {
        let host = End::HOST;
        let gpudirect = End { on_device: true, nic_registered: true };
        let staged = End { on_device: true, nic_registered: false };
        // A host region without keys (rdma turned off) is not this function's concern.
        let host_unkeyed = End { on_device: false, nic_registered: false };
        for (local, remote, stage) in [
            (host, host, false),
            (host_unkeyed, host, false),
            (gpudirect, gpudirect, false),
            (gpudirect, host, false),
            (host, gpudirect, false),
            (staged, host, true),
            (host, staged, true),
            (staged, gpudirect, true),
            (gpudirect, staged, true),
            (staged, staged, true),
        ] {
            assert_eq!(must_stage(local, remote), stage, "{local:?} -> {remote:?}");
        }
    }
}
