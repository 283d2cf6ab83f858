//! Writing and reading one file of the disk tier.
//!
//! Write: the header, key and value go to a temporary name in the key's hash directory;
//! with `fsync` on (the default) the file's data is flushed (`fdatasync`) before it is
//! renamed to its final name, and the directory is flushed after, so a final name always
//! names a complete file, also after a power loss. Without `fsync`, a crash of the process
//! is still safe (the page cache survives it) and a power loss can leave a final file with
//! missing data, which the value checksum catches on read. Either way a reader never gets
//! bytes that do not match the checksum.
//!
//! Writes use direct I/O (`O_DIRECT`) where the file system has it: the queued value already
//! sits in a 4 KiB-aligned image of the whole file ([`FileImage`]), so the kernel moves it to
//! the device without a page-cache copy; the zero tail up to the next 4 KiB is cut off
//! (`set_len`) before the flush. Reads use direct I/O too, in aligned pieces of up to 4 MiB
//! through a small aligned buffer, copied to the caller (whose memory need not be aligned);
//! without direct I/O, ordinary reads. The tier does not keep its files
//! in the page cache: read files are dropped from it (`POSIX_FADV_DONTNEED`) — DRAM is the
//! memory tier's, and a read of the disk tier measures the disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{fadvise, Advice};

use super::format::{data_offset, file_name, Header, ALIGN, MAX_HEADER_LEN, TMP_SUFFIX};
use crate::error::{Result, StoreError};

fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Disk(format!("{what} {}: {e}", path.display()))
}

/// A whole file in memory, 4 KiB-aligned for direct I/O: room for the header and key, the
/// value, zeros up to the next 4 KiB. Made when a value is queued (the one copy an offload makes).
pub struct FileImage {
    buf: Vec<u8>,
    start: usize,
    data_offset: usize,
    value_len: usize,
}

impl FileImage {
    pub fn new(key: &str, value: &[u8]) -> FileImage {
        let align = ALIGN as usize;
        let data_offset = data_offset(key.len()) as usize;
        let total = (data_offset + value.len()).div_ceil(align) * align;
        let mut buf = vec![0u8; total + align];
        let start = buf.as_ptr().align_offset(align);
        buf[start + data_offset..start + data_offset + value.len()].copy_from_slice(value);
        FileImage { buf, start, data_offset, value_len: value.len() }
    }

    pub fn value(&self) -> &[u8] {
        &self.buf[self.start + self.data_offset..self.start + self.data_offset + self.value_len]
    }

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

/// Writes `image` as the file of (`key`, `version`) under `dir`; returns its path and length.
pub fn write_file(dir: &Path, key: &str, version: u64, image: &mut FileImage, fsync: bool) -> Result<(PathBuf, u64)> {
    let (sub, name) = file_name(key, version);
    let sub = dir.join(sub);
    std::fs::create_dir_all(&sub).map_err(|e| io_err("creating", &sub, e))?;
    let path = sub.join(&name);
    let tmp = sub.join(format!("{name}.{:08x}{TMP_SUFFIX}", rand::random::<u32>()));
    let header = Header {
        key: key.to_string(),
        value_len: image.value_len(),
        version,
        value_crc: crc32fast::hash(image.value()),
    };
    let written = (|| -> std::io::Result<()> {
        let direct = rustix::fs::OFlags::DIRECT.bits() as i32;
        let mut f = match OpenOptions::new().write(true).create_new(true).custom_flags(direct).open(&tmp) {
            Ok(f) => f,
            // No direct I/O on this file system (tmpfs, some overlays): buffered.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                OpenOptions::new().write(true).create_new(true).open(&tmp)?
            }
            Err(e) => return Err(e),
        };
        f.write_all(image.aligned(&header.encode()))?;
        f.set_len(header.file_len())?;
        if fsync {
            f.sync_data()?;
        }
        let _ = fadvise(&f, 0, None, Advice::DontNeed);
        std::fs::rename(&tmp, &path)?;
        if fsync {
            File::open(&sub)?.sync_all()?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("writing", &tmp, e));
    }
    Ok((path, header.file_len()))
}

/// Reads the start of a file: enough for any header and key.
fn read_prefix(f: &File) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; MAX_HEADER_LEN];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    buf.truncate(n);
    Ok(buf)
}

/// Opens a file and checks its header; returns it with its length on disk.
pub fn read_header(path: &Path) -> Result<(File, Header)> {
    let f = File::open(path).map_err(|e| io_err("opening", path, e))?;
    let prefix = read_prefix(&f).map_err(|e| io_err("reading", path, e))?;
    let header = Header::decode(&prefix)?;
    let len = f.metadata().map_err(|e| io_err("reading", path, e))?.len();
    if len != header.file_len() {
        return Err(StoreError::CorruptFile(format!(
            "{}: {len} bytes, the header says {}",
            path.display(),
            header.file_len()
        )));
    }
    Ok((f, header))
}

/// Largest direct read.
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
        let buf = vec![0u8; len + ALIGN as usize];
        let start = buf.as_ptr().align_offset(ALIGN as usize);
        Scratch { buf, start }
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.start..self.start + len]
    }
}

/// Reads `buf.len()` bytes at `at` with direct I/O through `scratch`.
fn read_direct(f: &File, scratch: &mut Scratch, buf: &mut [u8], at: u64) -> std::io::Result<()> {
    let align = ALIGN as usize;
    let mut done = 0;
    while done < buf.len() {
        let pos = at + done as u64;
        let base = pos & !(ALIGN - 1);
        let skip = (pos - base) as usize;
        let want = (buf.len() - done).min(DIRECT_CHUNK - skip);
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
pub struct FileReader {
    direct: Option<(File, Scratch)>,
    file: File,
    header: Header,
    pos: u64,
    crc: crc32fast::Hasher,
    checked: bool,
}

impl FileReader {
    /// Opens the file of (`key`, `version`) of `size` bytes; any other content is an error.
    pub fn open(path: &Path, key: &str, version: u64, size: u64) -> Result<FileReader> {
        let (file, header) = read_header(path)?;
        if header.key != key || header.version != version || header.value_len != size {
            return Err(StoreError::CorruptFile(format!(
                "{} holds {:?} v{} ({} bytes), expected {key:?} v{version} ({size} bytes)",
                path.display(),
                header.key,
                header.version,
                header.value_len
            )));
        }
        let direct = open_direct(path).map(|f| {
            let scratch = Scratch::new((header.value_len as usize + ALIGN as usize).min(DIRECT_CHUNK));
            (f, scratch)
        });
        if direct.is_none() {
            let _ = fadvise(&file, header.data_offset(), None, Advice::Sequential);
        }
        Ok(FileReader { direct, file, header, pos: 0, crc: crc32fast::Hasher::new(), checked: false })
    }

    pub fn size(&self) -> u64 {
        self.header.value_len
    }

    pub fn remaining(&self) -> u64 {
        self.header.value_len - self.pos
    }

    /// Reads the next `buf.len()` bytes (at most what remains). After the last byte, checks
    /// the value's checksum: a mismatch is [`StoreError::CorruptFile`].
    pub fn read_next(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = (buf.len() as u64).min(self.remaining()) as usize;
        let at = data_offset(self.header.key.len()) + self.pos;
        let read = match &mut self.direct {
            Some((f, scratch)) => read_direct(f, scratch, &mut buf[..n], at),
            None => self.file.read_exact_at(&mut buf[..n], at),
        };
        read.map_err(|e| StoreError::Disk(format!("reading a file: {e}")))?;
        self.crc.update(&buf[..n]);
        self.pos += n as u64;
        if self.remaining() == 0 && !self.checked {
            self.checked = true;
            let crc = std::mem::take(&mut self.crc).finalize();
            if crc != self.header.value_crc {
                return Err(StoreError::CorruptFile(format!("value of {:?}: checksum mismatch", self.header.key)));
            }
        }
        Ok(n)
    }
}

impl Drop for FileReader {
    fn drop(&mut self) {
        let _ = fadvise(&self.file, 0, None, Advice::DontNeed);
    }
}
