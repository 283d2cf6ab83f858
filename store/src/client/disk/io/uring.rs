//! The io_uring engine: a file's bytes and its `fdatasync` go to the kernel as one linked
//! chain in one system call, and the writer sleeps once until both are done, instead of a
//! `pwritev`, a wake-up and an `fdatasync`. Each writer thread owns one small ring
//! ([`Ring`]), which never lets the caller's buffers go while the kernel holds them. A write
//! the ring refuses (a file system may not take io_uring writes as it takes plain ones) is
//! made with plain calls; a ring that refused, or whose wait failed, is given up for good and
//! the writer makes plain calls from then on ([`Uring`]).

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::psync::Psync;
use super::{EngineKind, IoEngine};

/// A writer's engine: its ring while the ring works, plain calls after.
pub struct Uring {
    ring: Option<Ring>,
}

impl Uring {
    /// An engine with a ring of its own; fails where the kernel makes no ring (no io_uring,
    /// refused by seccomp or `kernel.io_uring_disabled`, out of locked memory).
    pub fn new() -> io::Result<Uring> {
        Ok(Uring { ring: Some(Ring::new()?) })
    }

    /// Tests: an engine, or `None` (and a line saying so) where the kernel has no io_uring.
    #[cfg(test)]
    pub fn for_tests() -> Option<Uring> {
        Ring::for_tests().map(|r| Uring { ring: Some(r) })
    }

    /// Tests: the ring, while it is used.
    #[cfg(test)]
    pub fn ring(&mut self) -> Option<&mut Ring> {
        self.ring.as_mut()
    }

    /// Drops a broken ring (the next calls are plain).
    fn drop_broken(&mut self) {
        if self.ring.as_ref().is_some_and(Ring::is_broken) {
            tracing::warn!("disk tier: giving up this writer's io_uring after an error");
            self.ring = None;
        }
    }
}

impl IoEngine for Uring {
    fn write_all(&mut self, file: &File, slices: &[IoSlice<'_>], then_sync: bool) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else { return Psync.write_all(file, slices, then_sync) };
        match ring.write_all(file, slices, then_sync) {
            Ok(()) => Ok(()),
            Err(e) if ring.is_broken() => {
                self.drop_broken();
                Err(e)
            }
            // The file system is full: its answer, not the ring's; the ring is kept for when
            // there is room again (see `disk::space`).
            Err(e) if crate::error::is_no_space(&e) => Err(e),
            // Refused through the ring: once more with plain calls; this writer keeps to them.
            Err(e) => {
                tracing::warn!("disk tier: a write through io_uring failed ({e}); using plain system calls");
                self.ring = None;
                Psync.write_all(file, slices, then_sync)
            }
        }
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        let Some(ring) = self.ring.as_mut() else { return file.sync_data() };
        let synced = ring.sync(file);
        self.drop_broken();
        synced
    }

    fn kind(&self) -> EngineKind {
        match self.ring {
            Some(_) => EngineKind::IoUring,
            None => EngineKind::Psync,
        }
    }
}

const WRITE: u64 = 1;
const SYNC: u64 = 2;

/// A writer's io_uring (4 entries): a write and its flush go in as one linked submission,
/// and a call returns only once the kernel holds none of its entries.
pub struct Ring {
    ring: IoUring,
    /// Waiting failed for another reason than a signal, or the writer gave the ring up: it is
    /// not used again (see [`Self::is_broken`]).
    broken: bool,
    /// Entries pushed and completions taken back, since the start: the kernel holds the
    /// difference, less what still waits in the submission queue ([`Self::entries_in_kernel`]).
    pushed: u64,
    reaped: u64,
    /// Tests: every write is refused, as a file system might refuse io_uring writes.
    #[cfg(test)]
    pub refuse_writes: bool,
    /// Tests: the next wait hands the entries to the kernel, then fails as a broken ring's would.
    #[cfg(test)]
    pub fail_next_wait: bool,
}

impl Ring {
    /// A ring, or why the kernel refused one.
    pub fn new() -> io::Result<Ring> {
        Ok(Ring {
            ring: IoUring::new(4)?,
            broken: false,
            pushed: 0,
            reaped: 0,
            #[cfg(test)]
            refuse_writes: false,
            #[cfg(test)]
            fail_next_wait: false,
        })
    }

    /// Tests: a ring, or `None` (and a line saying so) where the kernel has none.
    #[cfg(test)]
    pub fn for_tests() -> Option<Ring> {
        Ring::new().map_err(|e| eprintln!("no io_uring here ({e}): nothing to test")).ok()
    }

    /// Whether the writer must drop this ring and make its calls one by one from now on.
    /// (Nothing of ours is left in the kernel's hands then: a failed wait returns only once
    /// the kernel holds no entry.)
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Entries the kernel took from this ring and has not handed back (completed and reaped):
    /// none between calls.
    pub fn entries_in_kernel(&mut self) -> u64 {
        let waiting = self.ring.submission().len() as u64;
        self.pushed - waiting - self.reaped
    }

    /// Writes `slices` at the start of `f` and, with `then_sync`, flushes its data
    /// (`fdatasync`) once the write has completed, in one submission. A short write is
    /// finished with ordinary writes (and the flush made after it).
    pub fn write_all(&mut self, f: &File, slices: &[IoSlice<'_>], then_sync: bool) -> io::Result<()> {
        #[cfg(test)]
        if self.refuse_writes {
            return Err(io::Error::from_raw_os_error(rustix::io::Errno::OPNOTSUPP.raw_os_error()));
        }
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let fd = types::Fd(f.as_raw_fd());
        let len = u32::try_from(slices.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // `IoSlice` is ABI-compatible with `struct iovec` on Unix.
        let write = opcode::Writev::new(fd, slices.as_ptr().cast(), len).offset(0).build().user_data(WRITE);
        let results = if then_sync {
            let flush = opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build().user_data(SYNC);
            self.run(&[write.flags(squeue::Flags::IO_LINK), flush])?
        } else {
            self.run(&[write])?
        };
        let written = result(results[0])?;
        if written < total {
            // The chain broke there (its flush was cancelled): the rest by hand.
            write_rest(f, slices, written)?;
            if then_sync {
                f.sync_data()?;
            }
            return Ok(());
        }
        if then_sync {
            result(results[1])?;
        }
        Ok(())
    }

    /// Flushes `f`'s data (`fdatasync`).
    pub fn sync(&mut self, f: &File) -> io::Result<()> {
        let flush =
            opcode::Fsync::new(types::Fd(f.as_raw_fd())).flags(types::FsyncFlags::DATASYNC).build().user_data(WRITE);
        result(self.run(&[flush])?[0]).map(|_| ())
    }

    /// Submits `entries` (at most two, user data WRITE then SYNC) and waits until the kernel
    /// has completed every one of them; returns their results in that order.
    ///
    /// It never returns while the kernel still holds an entry: the entries name the caller's
    /// buffers, which the caller frees or reuses once this returns. When waiting fails (the
    /// ring is then broken), entries the kernel never took stay in the submission queue of a
    /// ring that is never entered again; for those it took, the completion queue (memory the
    /// kernel writes without being asked) is polled until each has completed.
    fn run(&mut self, entries: &[squeue::Entry]) -> io::Result<[i32; 2]> {
        if self.broken {
            return Err(io::Error::other("io_uring ring given up"));
        }
        {
            let mut sq = self.ring.submission();
            if sq.capacity() - sq.len() < entries.len() {
                return Err(io::Error::other("io_uring submission queue full"));
            }
            for e in entries {
                // SAFETY: every buffer an entry names (the iovecs and the bytes they point
                // to, borrowed by the caller of `write_all`) and its file outlive this call,
                // which returns only once the kernel holds none of the entries (below: each
                // has completed, or, the wait having failed, was never taken from a queue
                // that is never submitted again). The ring is empty here: each call drains
                // what it submits.
                unsafe { sq.push(e) }.map_err(|_| io::Error::other("io_uring submission queue full"))?;
                self.pushed += 1;
            }
        }
        let mut results = [0i32; 2];
        let mut done = 0;
        let mut failed: Option<io::Error> = None;
        let mut poll = Duration::from_micros(100);
        loop {
            let left = match &failed {
                None => entries.len() - done,
                // Only what the kernel took is waited for.
                Some(_) => self.entries_in_kernel() as usize,
            };
            if left == 0 {
                break;
            }
            if failed.is_some() {
                // Sleeping is a system call: completion work the kernel queued for this
                // thread runs on its way back.
                std::thread::sleep(poll);
                poll = (poll * 2).min(Duration::from_millis(100));
            } else {
                match self.wait(left) {
                    Ok(_) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(errno::EINTR | errno::EAGAIN | errno::EBUSY)) => {}
                    Err(e) => {
                        self.broken = true;
                        let held = self.entries_in_kernel();
                        if held > 0 {
                            tracing::warn!(
                                "io_uring: waiting failed ({e}) with {held} entries in the kernel's hands; \
                                 polling until they complete"
                            );
                        }
                        failed = Some(e);
                    }
                }
            }
            for cqe in self.ring.completion() {
                match cqe.user_data() {
                    WRITE => results[0] = cqe.result(),
                    SYNC => results[1] = cqe.result(),
                    _ => continue,
                }
                self.reaped += 1;
                done += 1;
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }

    /// Submits what is queued and waits for `want` completions.
    fn wait(&mut self, want: usize) -> io::Result<usize> {
        #[cfg(test)]
        if std::mem::take(&mut self.fail_next_wait) {
            self.ring.submit()?;
            return Err(io::Error::from_raw_os_error(rustix::io::Errno::BADR.raw_os_error()));
        }
        self.ring.submit_and_wait(want)
    }
}

/// Error numbers the wait may return without anything being wrong.
mod errno {
    pub const EINTR: i32 = rustix::io::Errno::INTR.raw_os_error();
    pub const EAGAIN: i32 = rustix::io::Errno::AGAIN.raw_os_error();
    pub const EBUSY: i32 = rustix::io::Errno::BUSY.raw_os_error();
}

/// A completion's result: bytes moved, or the error it carries.
fn result(r: i32) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(r as usize)
    }
}

/// Writes what is left of `slices` after their first `done` bytes, at the same offsets.
fn write_rest(f: &File, slices: &[IoSlice<'_>], mut done: usize) -> io::Result<()> {
    let mut start = 0;
    for s in slices {
        let end = start + s.len();
        if done < end {
            f.write_all_at(&s[done - start..], done as u64)?;
            done = end;
        }
        start = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bytes_written_through_the_ring_are_the_files_bytes() {
        let Some(mut ring) = Ring::for_tests() else { return };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::create(&path).unwrap();
        let a: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let b: Vec<u8> = (0..7000u32).map(|i| (i % 13) as u8).collect();
        ring.write_all(&f, &[IoSlice::new(&a), IoSlice::new(&b)], true).unwrap();
        ring.write_all(&f, &[IoSlice::new(&b[..10])], false).unwrap();
        ring.sync(&f).unwrap();
        let mut got = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut got).unwrap();
        let mut want = [a, b.clone()].concat();
        want[..10].copy_from_slice(&b[..10]);
        assert!(got == want, "{} bytes read back", got.len());
    }

    #[test]
    fn a_write_the_kernel_refuses_is_an_error() {
        let Some(mut ring) = Ring::for_tests() else { return };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        let read_only = File::open(&path).unwrap();
        let e = ring.write_all(&read_only, &[IoSlice::new(b"abc")], true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(rustix::io::Errno::BADF.raw_os_error()), "{e}");
        // The ring is still usable.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        ring.write_all(&f, &[IoSlice::new(b"ok")], true).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"ok");
    }

    #[test]
    fn a_failed_wait_returns_only_once_the_kernel_is_done_with_the_buffers() {
        let Some(mut ring) = Ring::for_tests() else { return };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = File::create(&path).unwrap();
        let a: Vec<u8> = (0..(8 << 20) as u32).map(|i| (i % 249) as u8).collect();
        // The write and its flush go to the kernel, then waiting for them fails.
        ring.fail_next_wait = true;
        let e = ring.write_all(&f, &[IoSlice::new(&a)], true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(rustix::io::Errno::BADR.raw_os_error()), "{e}");
        assert!(ring.is_broken());
        // Had it returned earlier, the caller would now free or reuse `a` under the kernel.
        assert_eq!(ring.entries_in_kernel(), 0, "returned while the kernel held entries naming the buffer");
        assert!(std::fs::read(&path).unwrap() == a, "the kernel's write completed before the return");
        assert!(ring.write_all(&f, &[IoSlice::new(b"x")], false).is_err(), "a broken ring is not used again");
    }

    #[test]
    fn the_rest_of_a_short_write_lands_where_it_belongs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        let (a, b) = (b"0123".to_vec(), b"456789".to_vec());
        f.write_all_at(&a[..3], 0).unwrap(); // as if the kernel stopped after 3 bytes
        write_rest(&f, &[IoSlice::new(&a), IoSlice::new(&b)], 3).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
        write_rest(&f, &[IoSlice::new(&a), IoSlice::new(&b)], 7).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789");
    }
}
