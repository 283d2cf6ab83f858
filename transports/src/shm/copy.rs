//! The two ways bytes move on the shm transport: a memcpy to or from a peer's mapped memfd,
//! and `process_vm_readv`/`process_vm_writev` for a peer's other registered memory.

use std::io;

use crate::device::{DeviceMemory, Driver};
use crate::Opcode;

/// Copies `len` bytes between `local` and `remote`, one or both device memory, with the
/// device driver on a stream of `device`. The CPU touches neither range.
pub fn device(driver: &Driver, device: u32, op: Opcode, local: u64, remote: u64, len: u64) -> Result<(), String> {
    let (dst, src) = match op {
        Opcode::Read => (local, remote),
        Opcode::Write => (remote, local),
    };
    driver.copy(device, dst, src, len).map_err(|e| e.to_string())
}

/// [`process_vm`] for local device memory: through a pinned bounce buffer, filled from the
/// device before a write, copied to the device after a read.
///
/// # Safety
/// As for [`process_vm`]; `[local, +len)` lies in `memory`.
pub unsafe fn process_vm_staged(
    pid: i32,
    op: Opcode,
    memory: &DeviceMemory,
    local: u64,
    remote: u64,
    len: u64,
) -> Result<(), String> {
    let device = memory.allocation.device;
    let bounce = memory.driver.bounce(len).map_err(|e| e.to_string())?;
    match op {
        Opcode::Read => {
            // SAFETY: the bounce buffer is host memory of our own, at least `len` bytes long.
            unsafe { process_vm(pid, op, bounce.addr(), remote, len)? };
            memory.driver.copy(device, local, bounce.addr(), len).map_err(|e| e.to_string())
        }
        Opcode::Write => {
            memory.driver.copy(device, bounce.addr(), local, len).map_err(|e| e.to_string())?;
            // SAFETY: as above.
            unsafe { process_vm(pid, op, bounce.addr(), remote, len) }
        }
    }
}

/// Copies `len` bytes between local memory and a mapping of the peer's memory.
///
/// # Safety
/// `local` and `remote` must each be valid for `len` bytes, and nothing in this process may
/// hold a Rust reference to either range meanwhile.
pub unsafe fn memcpy(op: Opcode, local: *mut u8, remote: *mut u8, len: usize) {
    let (src, dst) = match op {
        Opcode::Read => (remote.cast_const(), local),
        Opcode::Write => (local.cast_const(), remote),
    };
    // SAFETY: the caller guarantees both ranges; they are distinct mappings (a region's own
    // memfd mapped twice by a process talking to itself aliases physically, which can only
    // garble the bytes of that odd request, never touch other memory).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// Moves `len` bytes between local memory at `local` and `[remote, +len)` of process `pid`
/// with one kernel copy. Errors name what the kernel refused.
///
/// # Safety
/// `[local, +len)` must be valid local memory nothing else uses meanwhile.
pub unsafe fn process_vm(pid: i32, op: Opcode, local: u64, remote: u64, len: u64) -> Result<(), String> {
    let mut done = 0u64;
    while done < len {
        let left = (len - done) as usize;
        let local_iov = libc::iovec { iov_base: (local + done) as *mut libc::c_void, iov_len: left };
        let remote_iov = libc::iovec { iov_base: (remote + done) as *mut libc::c_void, iov_len: left };
        // SAFETY: the local range is valid (caller); the kernel checks the remote range
        // against the other process's mappings and fails with EFAULT outside them.
        let n = unsafe {
            match op {
                Opcode::Read => libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0),
                Opcode::Write => libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0),
            }
        };
        match n {
            n if n > 0 => done += n as u64,
            0 => return Err("process_vm copied nothing".into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(describe(pid, &e));
            }
        }
    }
    Ok(())
}

/// Why the kernel refused a `process_vm_*` call, in words.
pub fn describe(pid: i32, e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => format!(
            "the kernel denies access to process {pid}'s memory ({e}): it runs as another \
             user, is not dumpable, or ptrace is restricted (kernel.yama.ptrace_scope)"
        ),
        Some(libc::ESRCH) => format!("process {pid} is gone ({e})"),
        Some(libc::EFAULT) => format!("the range is not mapped in process {pid} ({e})"),
        Some(libc::ENOSYS) => format!("process_vm_readv is not available here ({e})"),
        _ => format!("process_vm access to process {pid} failed: {e}"),
    }
}

/// Reads the peer's probe word: Ok when the kernel allows `process_vm_*` on the peer and the
/// word holds `expected` (so `pid` is really the peer that sent it).
pub fn probe(pid: i32, addr: u64, expected: u64) -> Result<(), String> {
    let mut word = 0u64;
    // SAFETY: `word` is a valid 8-byte local buffer.
    unsafe {
        process_vm(pid, Opcode::Read, &mut word as *mut u64 as u64, addr, std::mem::size_of::<u64>() as u64)?;
    }
    if word == expected {
        Ok(())
    } else {
        Err(format!("process {pid} is not the peer that answered (its probe word differs)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_vm_on_this_process_copies() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; 10_000];
        let pid = std::process::id() as i32;
        // SAFETY: both buffers live for the call and nothing else uses them.
        unsafe {
            process_vm(pid, Opcode::Read, dst.as_mut_ptr() as u64, src.as_ptr() as u64, 10_000).unwrap();
        }
        assert_eq!(src, dst);
        let word = Box::new(0x1234_5678_9abc_def0u64);
        let addr = &*word as *const u64 as u64;
        probe(pid, addr, *word).unwrap();
        assert!(probe(pid, addr, 1).unwrap_err().contains("not the peer"));
    }

    #[test]
    fn unmapped_remote_ranges_fail_cleanly() {
        let mut dst = [0u8; 16];
        // SAFETY: `dst` is a valid local buffer.
        let err =
            unsafe { process_vm(std::process::id() as i32, Opcode::Read, dst.as_mut_ptr() as u64, 8, 16) }.unwrap_err();
        assert!(err.contains("not mapped"), "{err}");
    }
}
