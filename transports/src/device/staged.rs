//! Slices whose local memory is on a device, moved by a transport that moves host memory
//! only: the transport gets a slice of a pinned bounce buffer instead, filled from the device
//! before a write, and copied to the device after a read.
//!
//! The caller's memory is touched by the device copies only, each inside the original slice's
//! claim; the bounce buffer belongs to the staged slice and lives as long as anything (the
//! transport's lanes) still refers to it, so a transport that touches it after the slice
//! ended touches memory of its own.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Bounce, DeviceMemory};
use crate::{Completion, CompletionSink, FailureReason, LocalAccess, LocalClaim, Opcode, Slice, SliceOutcome};

/// Turns `slice`, whose local range lies in `memory`, into a slice of a bounce buffer. For a
/// write the device's bytes are copied into the buffer first (by this thread, so that a
/// transport that sends a slice while the next one is staged overlaps the two). `None` when
/// the slice has ended already or failed here (it has then been reported).
pub fn stage(slice: Slice, memory: &DeviceMemory) -> Option<Slice> {
    let device = memory.allocation.device;
    let bounce = match memory.driver.bounce(slice.len) {
        Ok(bounce) => bounce,
        Err(e) => {
            slice.completion.fail(FailureReason::local(format!("no bounce buffer for device memory: {e}")));
            return None;
        }
    };
    if slice.opcode == Opcode::Write {
        let copied = slice
            .completion
            .with_local_access(|| memory.driver.copy(device, bounce.addr(), slice.local_addr, slice.len));
        match copied {
            None => return None, // ended (timed out) meanwhile: already reported
            Some(Ok(())) => {}
            Some(Err(e)) => {
                slice.completion.fail(FailureReason::local(format!("copying device memory to host failed: {e}")));
                return None;
            }
        }
    }
    let access = slice.completion.local_access()?;
    let Slice { opcode, local_addr, remote_addr, len, completion } = slice;
    let staged = Arc::new(Staged {
        memory: memory.clone(),
        opcode,
        device_addr: local_addr,
        len,
        bounce_addr: bounce.addr(),
        _bounce: bounce,
        original: Mutex::new(Some(completion)),
        access,
        claims: Mutex::new(Vec::new()),
    });
    let bounce_addr = staged.bounce_addr;
    Some(Slice { opcode, local_addr: bounce_addr, remote_addr, len, completion: Completion::new(staged, 0) })
}

/// The sink of a staged slice: claims on the bounce buffer are claims on the original slice
/// (so the transport stops at the original's end), and a read's completion copies the bytes
/// to the device before the original slice completes.
struct Staged {
    memory: DeviceMemory,
    opcode: Opcode,
    device_addr: u64,
    len: u64,
    bounce_addr: u64,
    _bounce: Bounce,
    original: Mutex<Option<Completion>>,
    access: LocalAccess,
    /// The original's claims held for the transport's accesses in progress.
    claims: Mutex<Vec<LocalClaim>>,
}

impl CompletionSink for Staged {
    fn begin_local_access(&self, _slice: usize) -> bool {
        match self.access.claim() {
            Some(claim) => {
                self.claims.lock().push(claim);
                true
            }
            None => false,
        }
    }

    fn end_local_access(&self, _slice: usize) {
        drop(self.claims.lock().pop());
    }

    fn complete(&self, _slice: usize, outcome: SliceOutcome) {
        let Some(original) = self.original.lock().take() else {
            return;
        };
        if self.opcode == Opcode::Write || outcome != SliceOutcome::Completed {
            original.complete(outcome);
            return;
        }
        let device = self.memory.allocation.device;
        let copied = original
            .with_local_access(|| self.memory.driver.copy(device, self.device_addr, self.bounce_addr, self.len));
        match copied {
            None => {} // ended meanwhile: its outcome is decided
            Some(Ok(())) => original.complete(SliceOutcome::Completed),
            Some(Err(e)) => original.fail(FailureReason::local(format!("copying into device memory failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mock::{Mock, BASE};
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    struct Sink {
        ended: AtomicBool,
        outcomes: parking_lot::Mutex<Vec<SliceOutcome>>,
    }

    impl CompletionSink for Sink {
        fn begin_local_access(&self, _: usize) -> bool {
            !self.ended.load(Ordering::SeqCst)
        }
        fn end_local_access(&self, _: usize) {}
        fn complete(&self, _: usize, outcome: SliceOutcome) {
            self.outcomes.lock().push(outcome);
        }
    }

    fn memory() -> (Arc<Mock>, DeviceMemory) {
        let mock = Mock::with_range();
        let memory = mock.memory(BASE, crate::device::mock::LEN);
        (mock, memory)
    }

    fn slice(opcode: Opcode, local_addr: u64, len: u64, sink: &Arc<Sink>) -> Slice {
        Slice { opcode, local_addr, remote_addr: 0x1000, len, completion: Completion::new(sink.clone(), 0) }
    }

    /// The staged slice's bytes (host memory of the bounce buffer), copied.
    fn bounce_bytes(s: &Slice) -> Vec<u8> {
        // SAFETY: the bounce buffer is host memory that lives as long as the staged slice.
        unsafe { std::slice::from_raw_parts(s.local_addr as *const u8, s.len as usize) }.to_vec()
    }

    /// Fills the staged slice's bounce buffer with `byte` (as a transport receiving would).
    fn fill_bounce(s: &Slice, byte: u8) {
        // SAFETY: as in `bounce_bytes`; nothing else uses the buffer meanwhile.
        unsafe { std::ptr::write_bytes(s.local_addr as *mut u8, byte, s.len as usize) }
    }

    #[test]
    fn a_write_is_copied_off_the_device_before_the_transport_sees_it() {
        let (mock, memory) = memory();
        let sink = Arc::new(Sink::default());
        let staged = stage(slice(Opcode::Write, BASE + 10, 100, &sink), &memory).unwrap();
        assert!(mock.at(staged.local_addr, 1).is_none(), "the transport gets host memory");
        assert_eq!(bounce_bytes(&staged), mock.bytes(10, 110));
        staged.completion.complete(SliceOutcome::Completed);
        assert_eq!(*sink.outcomes.lock(), vec![SliceOutcome::Completed]);
    }

    #[test]
    fn a_read_reaches_the_device_when_it_completes_and_not_after_its_end() {
        let (mock, memory) = memory();
        let sink = Arc::new(Sink::default());
        let staged = stage(slice(Opcode::Read, BASE + 1000, 64, &sink), &memory).unwrap();
        fill_bounce(&staged, 0xab);
        assert_ne!(mock.bytes(1000, 1001)[0], 0xab, "nothing reaches the device before completion");
        staged.completion.complete(SliceOutcome::Completed);
        assert!(mock.bytes(1000, 1064).iter().all(|&b| b == 0xab));
        assert_eq!(*sink.outcomes.lock(), vec![SliceOutcome::Completed]);

        // A read whose slice ended (timed out) meanwhile leaves the device alone.
        let sink = Arc::new(Sink::default());
        let staged = stage(slice(Opcode::Read, BASE + 2000, 64, &sink), &memory).unwrap();
        fill_bounce(&staged, 0xcd);
        sink.ended.store(true, Ordering::SeqCst);
        staged.completion.complete(SliceOutcome::Completed);
        assert!(mock.bytes(2000, 2064).iter().all(|&b| b != 0xcd));
        assert!(!sink.outcomes.lock().contains(&SliceOutcome::Completed));
    }

    #[test]
    fn a_failure_reaches_the_original_slice_unchanged() {
        let (mock, memory) = memory();
        let sink = Arc::new(Sink::default());
        let staged = stage(slice(Opcode::Read, BASE, 16, &sink), &memory).unwrap();
        fill_bounce(&staged, 0xee);
        let reason = FailureReason::peer_gone("the peer died");
        staged.completion.fail(reason.clone());
        assert_eq!(*sink.outcomes.lock(), vec![SliceOutcome::Failed(reason)]);
        assert_ne!(mock.bytes(0, 1)[0], 0xee, "a failed read writes nothing to the device");
    }
}
