//! Writing and reading one file of the disk tier.
//!
//! Write: the header, key and value go to a temporary name in the key's hash directory
//! ([`write_staged`]). With `fsync` on (the default) the file's data is flushed before it is
//! renamed to its final name ([`Staged::rename`]), and the rename is flushed before anyone is
//! told about the file, so a final name always names a complete file, also after a power
//! loss. How depends on the [`super::FsyncScope`]: by default the committer flushes the
//! whole file system once for all the files of a round, then renames them and flushes it again
//! ([`sync_file_system`]); with `file`, each writer `fdatasync`s its file ([`Staged::flush`])
//! and the committer flushes the directories of a round's renames ([`sync_dirs`]). Without
//! `fsync`, a crash of the process is still safe (the page cache survives it) and a power loss
//! can leave a final file with missing data, which the value checksum catches on read. Either
//! way a reader never gets bytes that do not match the checksum.
//!
//! Writes use direct I/O (`O_DIRECT`) where the file system has it, from 4 KiB-aligned memory,
//! so the kernel moves the value to the device without a page-cache copy. The value is either
//! in a 4 KiB-aligned image of the whole file made when it was queued ([`FileImage`]), or,
//! when the put left a 4 KiB-aligned replica in this client's own segment, read where it lies
//! ([`ResidentValue`]: only the header and the last partial 4 KiB are copied, and a value whose
//! CRC changed meanwhile is not written). The zero tail up to the next 4 KiB is cut off
//! (`set_len`) before the flush. A writer with an io_uring sends the write (and, when nothing
//! is left to cut, the flush) through it ([`super::io`]). Reads use direct I/O too: the header and the first piece in
//! one request, straight into the caller's memory when it is 4 KiB-aligned, through a small
//! aligned buffer otherwise (see [`FileReader`]); without direct I/O, ordinary reads, and the
//! files are dropped from the page cache after use (`POSIX_FADV_DONTNEED`) — DRAM is the
//! memory tier's, and a read of the disk tier measures the disk.

use std::fs::{File, OpenOptions};
use std::io::{IoSlice, IoSliceMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{fadvise, Advice};

use super::format::{data_offset, file_name, Header, ALIGN, MAX_HEADER_LEN, TMP_SUFFIX};
use super::io::IoEngine;
use super::recycle::Retired;
use crate::error::{Result, StoreError};

fn io_err(what: &'static str, path: &Path, source: std::io::Error) -> StoreError {
    StoreError::DiskIo { what, path: path.to_path_buf(), source }
}

/// A whole file in memory, 4 KiB-aligned for direct I/O: room for the header and key, the
/// value, zeros up to the next 4 KiB. Made when a value is queued (the one copy an offload makes).
pub struct FileImage {
    buf: Vec<u8>,
    start: usize,
    data_offset: usize,
    value_len: usize,
    /// CRC-32 of the value, taken with the copy (on the putting thread, while its call to
    /// the master is out) rather than on a writer.
    value_crc: u32,
}

impl FileImage {
    /// The image of `key`'s file holding a copy of `value` (its CRC-32 taken with the copy), in
    /// fresh memory.
    pub fn new(key: &str, value: &[u8]) -> FileImage {
        FileImage::reusing(Vec::new(), key, value)
    }

    /// Bytes of memory an image of `value_len` bytes under a key of `key_len` bytes takes.
    pub fn memory_len(key_len: usize, value_len: usize) -> usize {
        let align = ALIGN as usize;
        (data_offset(key_len) as usize + value_len).div_ceil(align) * align + align
    }

    /// Like [`Self::new`], in `buf` when it is large enough (a recycled image's memory: no
    /// fresh pages to fault in); only the padding is zeroed, the value overwrites the rest.
    pub fn reusing(mut buf: Vec<u8>, key: &str, value: &[u8]) -> FileImage {
        let align = ALIGN as usize;
        let data_offset = data_offset(key.len()) as usize;
        let total = (data_offset + value.len()).div_ceil(align) * align;
        if buf.len() < total + align {
            buf = vec![0u8; total + align];
        }
        let start = buf.as_ptr().align_offset(align);
        buf[start..start + data_offset].fill(0);
        let copy = &mut buf[start + data_offset..start + data_offset + value.len()];
        copy.copy_from_slice(value);
        let value_crc = crc32fast::hash(copy);
        buf[start + data_offset + value.len()..start + total].fill(0);
        FileImage { buf, start, data_offset, value_len: value.len(), value_crc }
    }

    /// The image's memory, for [`Self::reusing`].
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// The value's length, in bytes.
    pub fn value_len(&self) -> u64 {
        self.value_len as u64
    }

    /// The aligned bytes to write: header, key, value and the zero tail.
    fn aligned(&mut self, header: &[u8]) -> &[u8] {
        let align = ALIGN as usize;
        self.buf[self.start..self.start + header.len()].copy_from_slice(header);
        let total = (self.data_offset + self.value_len).div_ceil(align) * align;
        &self.buf[self.start..self.start + total]
    }
}

/// A value the writers read where it already lies: the putting client's own replica, in its
/// segment, which `keep` keeps mapped. Its CRC-32 is taken from the caller's bytes during the
/// put ([`super::DiskTier::prepare_resident`]). The range changes only if the master gave it to another object meanwhile (this one
/// evicted or removed); the writer then finds the CRC changed and drops the file.
pub struct ResidentValue {
    _keep: Box<dyn std::any::Any + Send + Sync>,
    addr: u64,
    len: usize,
    crc: u32,
}

impl ResidentValue {
    /// # Safety
    /// `[addr, addr + len)` stays mapped and readable while `keep` lives.
    pub unsafe fn new(keep: Box<dyn std::any::Any + Send + Sync>, addr: u64, len: usize) -> ResidentValue {
        ResidentValue { _keep: keep, addr, len, crc: 0 }
    }

    /// The value's CRC-32 as the put saw it.
    pub(super) fn expecting(self, crc: u32) -> ResidentValue {
        ResidentValue { crc, ..self }
    }

    /// The value's length, in bytes.
    pub fn value_len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: mapped while `_keep` lives (see `new`); plain bytes, valid whatever their
        // values, and a change under us is caught by the CRC (`unchanged`).
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Whether direct I/O can read the value in place (else it is copied: [`Self::into_image`]).
    pub fn in_place(&self) -> bool {
        self.addr.is_multiple_of(ALIGN)
    }

    /// Whether the bytes still have the CRC the put saw.
    pub fn unchanged(&self) -> bool {
        crc32fast::hash(self.bytes()) == self.crc
    }

    /// A copy in a file image (in `spare` when large enough); None when the bytes changed.
    pub fn into_image(self, spare: Vec<u8>, key: &str) -> Option<FileImage> {
        let image = FileImage::reusing(spare, key, self.bytes());
        (image.value_crc == self.crc).then_some(image)
    }

    /// Writes header, value and zero tail at the file's start; the value straight from where
    /// it lies when 4 KiB-aligned (only its last partial 4 KiB is copied).
    fn write_to(&self, out: &mut Output<'_>, header: &[u8], data_offset: usize) -> std::io::Result<()> {
        let align = ALIGN as usize;
        let bytes = self.bytes();
        let whole = self.len / align * align;
        let tail = self.len - whole;
        let tail_room = if tail > 0 { align } else { 0 };
        let mut edges = vec![0u8; data_offset + tail_room + align];
        let start = edges.as_ptr().align_offset(align);
        let (head, rest) = edges[start..].split_at_mut(data_offset);
        head[..header.len()].copy_from_slice(header);
        let tail_buf = &mut rest[..tail_room];
        tail_buf[..tail].copy_from_slice(&bytes[whole..]);
        out.write_all(&mut [IoSlice::new(head), IoSlice::new(&bytes[..whole]), IoSlice::new(tail_buf)])
    }
}

/// Where a writer's bytes go: its file, through the writer's engine.
struct Output<'a> {
    file: File,
    engine: &'a mut dyn IoEngine,
    /// Flush the file's data right after the write, in the same call.
    then_sync: bool,
    /// Whether that flush was done.
    synced: bool,
}

impl Output<'_> {
    fn write_all(&mut self, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        self.engine.write_all(&self.file, slices, self.then_sync)?;
        self.synced = self.then_sync;
        Ok(())
    }
}

/// What a writer writes: a whole file image, or a value where it lies.
pub enum FileBody {
    /// A copy of the value, in a file image.
    Image(FileImage),
    /// The value where it lies, the putting client's own replica.
    Resident(ResidentValue),
}

impl FileBody {
    /// The value's length, in bytes, whichever body it is.
    pub fn value_len(&self) -> u64 {
        match self {
            FileBody::Image(i) => i.value_len(),
            FileBody::Resident(v) => v.len as u64,
        }
    }

    fn value_crc(&self) -> u32 {
        match self {
            FileBody::Image(i) => i.value_crc,
            FileBody::Resident(v) => v.crc,
        }
    }

    /// Bytes a write of this body puts in its file with a `data_offset`-byte header: whole
    /// 4 KiB blocks.
    fn written_len(&self, data_offset: u64) -> u64 {
        (data_offset + self.value_len()).div_ceil(ALIGN) * ALIGN
    }

    /// An image's memory, for reuse.
    pub fn into_buffer(self) -> Option<Vec<u8>> {
        match self {
            FileBody::Image(i) => Some(i.into_buffer()),
            FileBody::Resident(_) => None,
        }
    }
}

/// A file written under its temporary name, not yet flushed nor renamed.
pub struct Staged {
    file: File,
    direct: bool,
    tmp: PathBuf,
    /// The final name.
    pub path: PathBuf,
    /// Its directory.
    pub dir: PathBuf,
    /// The file's length (it takes [`super::format::disk_len`] of it on disk).
    pub file_len: u64,
    /// Written over an old file rather than a new one.
    pub recycled: bool,
    /// Its data was flushed with the write (see [`Self::flush`]).
    synced: bool,
}

/// Writes `image` as the file of (`key`, `version`) under `dir`, under a temporary name,
/// over the file `reuse` when given (renamed to the temporary name first; a new file when
/// that fails). [`Staged::flush`] and [`Staged::rename`] then put it in place, and
/// [`sync_dirs`] makes the renames durable.
///
/// The bytes go through the writer's `engine`, and with `sync` the data flush goes with them
/// when nothing is left to do to the file after the write (its length is already right);
/// otherwise [`Staged::flush`] does it.
pub fn write_staged(
    dir: &Path,
    key: &str,
    version: u64,
    body: &mut FileBody,
    reuse: Option<&Retired>,
    engine: &mut dyn IoEngine,
    sync: bool,
) -> Result<Staged> {
    let (sub, name) = file_name(key, version);
    let sub = dir.join(sub);
    let path = sub.join(&name);
    let tmp = sub.join(format!("{name}.{:08x}{TMP_SUFFIX}", rand::random::<u32>()));
    let header = Header { key: key.to_string(), value_len: body.value_len(), version, value_crc: body.value_crc() };
    let reused = reuse.and_then(|r| {
        // The rename is atomic: the old file's name (a retired or evicted file) is gone at once.
        match in_dir(&sub, || std::fs::rename(&r.path, &tmp)) {
            Ok(_) => Some(r.len),
            Err(e) => {
                tracing::debug!("disk tier: not reusing {}: {e}", r.path.display());
                let _ = std::fs::remove_file(&r.path);
                None
            }
        }
    });
    let written = (|| -> std::io::Result<(File, bool, bool)> {
        let direct = rustix::fs::OFlags::DIRECT.bits() as i32;
        let open = |flags: i32| {
            let mut o = OpenOptions::new();
            match reused {
                Some(_) => o.write(true),
                None => o.write(true).create_new(true),
            };
            o.custom_flags(flags).open(&tmp)
        };
        let (file, direct_io) = match in_dir(&sub, || open(direct)) {
            Ok(f) => (f, true),
            // No direct I/O on this file system (tmpfs, some overlays): buffered.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => (open(0)?, false),
            Err(e) => return Err(e),
        };
        let header_bytes = header.encode();
        // What the write leaves: whole 4 KiB blocks, over whatever a reused file had. (A reused
        // file's length is known in whole blocks; that decides the same: a file no longer
        // than the blocks written is covered by them, a longer one must be cut either way.)
        let written = body.written_len(header.data_offset());
        let len_fix = written.max(reused.unwrap_or(0)) != header.file_len();
        let mut out = Output { file, engine, then_sync: sync && !len_fix, synced: false };
        match body {
            FileBody::Image(image) => out.write_all(&mut [IoSlice::new(image.aligned(&header_bytes))])?,
            FileBody::Resident(v) => v.write_to(&mut out, &header_bytes, header.data_offset() as usize)?,
        }
        if len_fix {
            out.file.set_len(header.file_len())?;
        }
        Ok((out.file, direct_io, out.synced))
    })();
    match written {
        Ok((file, direct, synced)) => Ok(Staged {
            file,
            direct,
            tmp,
            path,
            dir: sub,
            file_len: header.file_len(),
            recycled: reused.is_some(),
            synced,
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(io_err("writing", &tmp, e))
        }
    }
}

/// Runs `op`, which makes an entry in `dir`; when something was missing, makes `dir` (a
/// no-op when it exists, e.g. made by another writer meanwhile) and runs `op` once more. A
/// hash directory exists after its first file: it is made only when missing, rather than
/// asked for on every write (a mkdir locks the parent directory).
fn in_dir<T>(dir: &Path, op: impl Fn() -> std::io::Result<T>) -> std::io::Result<T> {
    match op() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            op()
        }
        other => other,
    }
}

impl Staged {
    /// Flushes the file's data (`fdatasync`): after this, renaming it is safe.
    pub fn flush(&self, engine: &mut dyn IoEngine) -> Result<()> {
        if self.synced {
            return Ok(());
        }
        engine.sync_data(&self.file).map_err(|e| io_err("flushing", &self.tmp, e))
    }

    /// Renames the file to its final name (after it is flushed, when flushing is on). The
    /// rename itself is durable after [`sync_dirs`] on its directory, or [`sync_file_system`].
    pub fn rename(self) -> Result<()> {
        if !self.direct {
            let _ = fadvise(&self.file, 0, None, Advice::DontNeed);
        }
        std::fs::rename(&self.tmp, &self.path).map_err(|e| {
            let _ = std::fs::remove_file(&self.tmp);
            io_err("renaming", &self.tmp, e)
        })
    }

    /// Gives the write up (its temporary file goes).
    pub fn abandon(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Flushes directories (each once), making the renames in them durable. One flush of a
/// directory covers every rename made in it before the call.
pub fn sync_dirs<'a>(dirs: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    let mut done: Vec<&Path> = Vec::new();
    for d in dirs {
        if done.contains(&d) {
            continue;
        }
        File::open(d).and_then(|f| f.sync_all()).map_err(|e| io_err("flushing", d, e))?;
        done.push(d);
    }
    Ok(())
}

/// Flushes the whole file system that holds `dir` (`syncfs`): every file's data and metadata
/// written on it so far, and every rename, reach the device (Linux documents it as an `fsync`
/// of every file of that file system). Then `fsync`s `dir` itself, for one more device flush
/// where `syncfs` needs it: a file system without a journal (ext2, or ext4 made without one, as
/// on this project's machines) gets some of its metadata written to the device only after
/// `syncfs`'s flush; on a journalling one that flush is already done and this costs nothing
/// more. Since Linux 5.8 `syncfs` also reports an earlier write-back error on the file system;
/// this tier's writes use direct I/O where they can, which report their errors themselves.
pub fn sync_file_system(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| {
            rustix::fs::syncfs(&f)?;
            f.sync_all()
        })
        .map_err(|e| io_err("flushing the file system of", dir, e))
}

/// Reads the start of a file (enough for any header and key) into `buf`; returns the bytes read.
fn read_prefix(f: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Checks a file's header (from its first bytes) against its length on disk.
fn check_header(f: &File, path: &Path, prefix: &[u8]) -> Result<Header> {
    let header = Header::decode(prefix)?;
    let len = f.metadata().map_err(|e| io_err("reading", path, e))?.len();
    if len != header.file_len() {
        return Err(StoreError::CorruptFile(format!(
            "{}: {len} bytes, the header says {}",
            path.display(),
            header.file_len()
        )));
    }
    Ok(header)
}

/// Opens a file and checks its header; returns it with its length on disk.
pub fn read_header(path: &Path) -> Result<(File, Header)> {
    let f = File::open(path).map_err(|e| io_err("opening", path, e))?;
    let mut buf = vec![0u8; MAX_HEADER_LEN];
    let n = read_prefix(&f, &mut buf).map_err(|e| io_err("reading", path, e))?;
    let header = check_header(&f, path, &buf[..n])?;
    Ok((f, header))
}

/// Largest direct read through the scratch buffer.
const DIRECT_CHUNK: usize = 4 << 20;

fn open_direct(path: &Path) -> Option<File> {
    let direct = rustix::fs::OFlags::DIRECT.bits() as i32;
    OpenOptions::new().read(true).custom_flags(direct).open(path).ok()
}

/// A 4 KiB-aligned scratch buffer for direct reads.
struct Scratch {
    buf: Vec<u8>,
    start: usize,
}

impl Scratch {
    fn new(len: usize) -> Scratch {
        let len = len.div_ceil(ALIGN as usize) * ALIGN as usize;
        let buf = vec![0u8; len + ALIGN as usize];
        let start = buf.as_ptr().align_offset(ALIGN as usize);
        Scratch { buf, start }
    }
    fn capacity(&self) -> usize {
        self.buf.len() - ALIGN as usize
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.start..self.start + len]
    }
}

fn is_aligned(v: u64) -> bool {
    v.is_multiple_of(ALIGN)
}

/// Reads exactly `buf.len()` bytes at `at` (both 4 KiB multiples, `buf` 4 KiB-aligned) from a
/// direct-I/O file straight into `buf`.
fn read_direct_into(f: &File, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
        if !is_aligned(got as u64) && got < buf.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads `buf.len()` bytes at `at` from a direct-I/O file through `scratch` (any alignment).
fn read_direct_via(f: &File, scratch: &mut Scratch, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    let align = ALIGN as usize;
    let mut done = 0;
    while done < buf.len() {
        let pos = at + done as u64;
        let base = pos & !(ALIGN - 1);
        let skip = (pos - base) as usize;
        let want = (buf.len() - done).min(scratch.capacity() - skip);
        let span = (skip + want).div_ceil(align) * align;
        let window = scratch.get(span);
        let mut got = 0;
        while got < skip + want {
            match f.read_at(&mut window[got..], base + got as u64)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => got += n,
            }
            if got % align != 0 && got < skip + want {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        buf[done..done + want].copy_from_slice(&window[skip..skip + want]);
        done += want;
    }
    Ok(())
}

/// Reads a file's value in order, piece by piece, checking the value's checksum at the end.
///
/// With direct I/O (one descriptor opened with `O_DIRECT`), the header is read together with
/// the first piece in one request (`preadv`: the header's 4 KiB blocks into a small aligned
/// buffer, the value into the caller's memory) and checked before any byte is counted as
/// read; a piece whose memory and file offset are 4 KiB-aligned is read straight into the
/// caller's memory (its 4 KiB multiple; a shorter tail through a small aligned scratch
/// buffer); other pieces go through the scratch buffer and are copied. Without direct I/O,
/// ordinary reads, the header first.
pub struct FileReader {
    file: File,
    path: PathBuf,
    direct: bool,
    scratch: Option<Scratch>,
    /// What the caller expects; checked against the header on the first read (direct I/O)
    /// or at open.
    key: String,
    version: u64,
    size: u64,
    header: Option<Header>,
    pos: u64,
    crc: crc32fast::Hasher,
    checked: bool,
}

impl FileReader {
    /// Opens the file of (`key`, `version`) of `size` bytes; any other content is an error
    /// (at open, or with direct I/O at the first read). No file at `path` is
    /// [`StoreError::NotFound`].
    pub fn open(path: &Path, key: &str, version: u64, size: u64) -> Result<FileReader> {
        let (file, direct) = match open_direct(path) {
            Some(f) => (f, true),
            None => match File::open(path) {
                Ok(f) => (f, false),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StoreError::NotFound(key.to_string()))
                }
                Err(e) => return Err(io_err("opening", path, e)),
            },
        };
        let mut r = FileReader {
            file,
            path: path.to_path_buf(),
            direct,
            scratch: None,
            key: key.to_string(),
            version,
            size,
            header: None,
            pos: 0,
            crc: crc32fast::Hasher::new(),
            checked: false,
        };
        if !direct {
            let mut buf = vec![0u8; MAX_HEADER_LEN];
            let n = read_prefix(&r.file, &mut buf).map_err(|e| io_err("reading", path, e))?;
            r.accept_header(&buf[..n])?;
            let _ = fadvise(&r.file, data_offset(key.len()), None, Advice::Sequential);
        }
        Ok(r)
    }

    /// Checks the header (in `prefix`, the file's first bytes) against what the caller expects.
    fn accept_header(&mut self, prefix: &[u8]) -> Result<()> {
        let h = check_header(&self.file, &self.path, prefix)?;
        if h.key != self.key || h.version != self.version || h.value_len != self.size {
            return Err(StoreError::CorruptFile(format!(
                "{} holds {:?} v{} ({} bytes), expected {:?} v{} ({} bytes)",
                self.path.display(),
                h.key,
                h.version,
                h.value_len,
                self.key,
                self.version,
                self.size
            )));
        }
        self.header = Some(h);
        Ok(())
    }

    /// The value's length, in bytes (as the master and the header say).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes of the value not read yet.
    pub fn remaining(&self) -> u64 {
        self.size - self.pos
    }

    fn scratch_for(slot: &mut Option<Scratch>, remaining: u64) -> &mut Scratch {
        // Made once per reader, as large as what is left (up to 4 MiB).
        let len = ((remaining as usize).min(DIRECT_CHUNK) + ALIGN as usize).max(2 * ALIGN as usize);
        slot.get_or_insert_with(|| Scratch::new(len))
    }

    /// Direct I/O, nothing read yet: the header's blocks, and as much of `buf` as can go
    /// straight into it, in one request; then the header is checked. Returns the bytes of
    /// `buf` filled.
    fn read_first(&mut self, buf: &mut [u8]) -> Result<usize> {
        let prefix = data_offset(self.key.len()) as usize;
        let bulk = if is_aligned(buf.as_ptr() as u64) { buf.len() & !(ALIGN as usize - 1) } else { 0 };
        let io = |e: std::io::Error| io_err("reading", &self.path, e);
        let mut head = Scratch::new(prefix);
        let window = head.get(prefix);
        let mut got = 0usize;
        // A short read stops at a block boundary or at the end of the file.
        loop {
            let n = if got < prefix {
                let mut iov = [IoSliceMut::new(&mut window[got..]), IoSliceMut::new(&mut buf[..bulk])];
                let iov = if bulk == 0 { &mut iov[..1] } else { &mut iov[..] };
                rustix::io::preadv(&self.file, iov, got as u64).map_err(|e| io(e.into()))?
            } else if got < prefix + bulk {
                self.file.read_at(&mut buf[got - prefix..bulk], got as u64).map_err(io)?
            } else {
                break;
            };
            got += n;
            if n == 0 || !is_aligned(got as u64) {
                break;
            }
        }
        if got < prefix {
            // Shorter than the expected header: check what is there (a clear error either way).
            self.accept_header(&window[..got])?;
            return Err(StoreError::CorruptFile(format!("{}: shorter than its header", self.path.display())));
        }
        self.accept_header(window)?;
        if got < prefix + bulk {
            return Err(StoreError::CorruptFile(format!("{}: shorter than its header says", self.path.display())));
        }
        Ok(bulk)
    }

    fn read_piece(&mut self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        if !self.direct {
            return self.file.read_exact_at(buf, at);
        }
        // The aligned bulk straight into the caller's memory, the rest through the scratch.
        let bulk =
            if is_aligned(buf.as_ptr() as u64) && is_aligned(at) { buf.len() & !(ALIGN as usize - 1) } else { 0 };
        if bulk > 0 {
            read_direct_into(&self.file, &mut buf[..bulk], at)?;
        }
        if bulk < buf.len() {
            let scratch = Self::scratch_for(&mut self.scratch, self.size - self.pos);
            read_direct_via(&self.file, scratch, &mut buf[bulk..], at + bulk as u64)?;
        }
        Ok(())
    }

    /// Reads the next `buf.len()` bytes (at most what remains). After the last byte, checks
    /// the value's checksum: a mismatch is [`StoreError::CorruptFile`].
    pub fn read_next(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = (buf.len() as u64).min(self.remaining()) as usize;
        let buf = &mut buf[..n];
        if !(self.direct && n >= PIPELINED_READ && self.read_pipelined(buf)?) {
            self.read_value_at(buf, self.pos)?;
            self.crc.update(buf);
        }
        self.pos += n as u64;
        if self.remaining() == 0 && !self.checked {
            self.checked = true;
            let crc = std::mem::take(&mut self.crc).finalize();
            if Some(crc) != self.header.as_ref().map(|h| h.value_crc) {
                return Err(StoreError::CorruptFile(format!("value of {:?}: checksum mismatch", self.key)));
            }
        }
        Ok(n)
    }

    /// Reads `buf.len()` bytes of the value from `pos` (plus the header first, when nothing
    /// was read yet), without taking their checksum.
    fn read_value_at(&mut self, buf: &mut [u8], pos: u64) -> Result<()> {
        let mut done = 0;
        if self.header.is_none() {
            done = self.read_first(buf)?;
        }
        let at = data_offset(self.key.len()) + pos + done as u64;
        self.read_piece(&mut buf[done..], at).map_err(|e| io_err("reading", &self.path, e))
    }

    /// A large read, in pieces of [`READ_PIECE`]: a helper thread takes each piece's checksum
    /// while the next one is read, so only the last piece's checksum adds to the read's time
    /// (a 25 MiB CRC-32 takes 2-3 ms here, against about 20 ms for the read). Returns false,
    /// having read nothing, when no thread can be had (the caller then reads it in one go).
    fn read_pipelined(&mut self, buf: &mut [u8]) -> Result<bool> {
        std::thread::scope(|s| {
            let (pieces_tx, pieces_rx) = crossbeam_channel::unbounded::<&[u8]>();
            let hasher = std::thread::Builder::new().name("crescent-disk-crc".into()).spawn_scoped(s, move || {
                let mut crc = crc32fast::Hasher::new();
                for piece in pieces_rx {
                    crc.update(piece);
                }
                crc
            });
            let Ok(hasher) = hasher else { return Ok(false) };
            let mut read = Ok(());
            let mut pos = self.pos;
            for piece in buf.chunks_mut(READ_PIECE) {
                read = self.read_value_at(piece, pos);
                if read.is_err() {
                    break;
                }
                pos += piece.len() as u64;
                let _ = pieces_tx.send(piece);
            }
            drop(pieces_tx);
            let crc = hasher.join().expect("the checksum thread does not panic");
            read?;
            self.crc.combine(&crc);
            Ok(true)
        })
    }
}

/// Bytes per read of a large read ([`FileReader::read_pipelined`]): a few MiB still make deep
/// enough requests for a device (the kernel splits them), and here `dd` itself reads 25 MiB
/// faster in 4 MiB reads than in one.
const READ_PIECE: usize = 4 << 20;

/// Reads from this size on are pipelined. `storebench ssd`, seven alternated pairs: 25 MiB
/// reads on miss went from 776-1150 to 1181-1431 MiB/s; at 10 MiB (three pieces) no
/// difference showed through the noise, so smaller reads stay one request.
const PIPELINED_READ: usize = 4 * READ_PIECE;

impl Drop for FileReader {
    fn drop(&mut self) {
        if !self.direct {
            let _ = fadvise(&self.file, 0, None, Advice::DontNeed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::io::uring::Uring;
    use super::super::io::EngineKind;
    use super::*;

    #[test]
    fn a_directory_made_by_another_writer_in_between_is_not_an_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ab");
        let calls = std::cell::Cell::new(0);
        // The first try finds no directory, and another writer makes it right then.
        let got = in_dir(&dir, || {
            calls.set(calls.get() + 1);
            if calls.get() == 1 {
                std::fs::create_dir(&dir).unwrap();
                return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
            }
            File::create(dir.join("f"))
        });
        assert!(got.is_ok(), "{got:?}");
        assert_eq!(calls.get(), 2);
        // A name that stays missing is still reported.
        let gone = in_dir(&dir, || std::fs::rename(dir.join("missing"), dir.join("g")));
        assert_eq!(gone.unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn a_write_the_ring_refuses_is_made_with_plain_calls_and_the_ring_given_up() {
        let Some(mut engine) = Uring::for_tests() else { return };
        engine.ring().unwrap().refuse_writes = true;
        let root = tempfile::tempdir().unwrap();
        let value: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        let mut body = FileBody::Image(FileImage::new("k", &value));
        let staged = write_staged(root.path(), "k", 7, &mut body, None, &mut engine, true).unwrap();
        assert_eq!(engine.kind(), EngineKind::Psync, "the writer keeps to plain calls after a refusal");
        staged.flush(&mut engine).unwrap();
        let path = staged.path.clone();
        staged.rename().unwrap();
        let mut reader = FileReader::open(&path, "k", 7, value.len() as u64).unwrap();
        let mut got = vec![0u8; value.len()];
        let mut off = 0;
        while off < got.len() {
            off += reader.read_next(&mut got[off..]).unwrap();
        }
        assert!(got == value);
    }
}
