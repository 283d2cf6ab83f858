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
//! The tier does not keep its files in the page cache: written and read files are dropped
//! from it (`POSIX_FADV_DONTNEED`) — DRAM is the memory tier's, and a read of the disk tier
//! measures the disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{fadvise, Advice};

use super::format::{data_offset, file_name, Header, MAX_HEADER_LEN, TMP_SUFFIX};
use crate::error::{Result, StoreError};

fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Disk(format!("{what} {}: {e}", path.display()))
}

/// Writes `value` as the file of (`key`, `version`) under `dir`; returns its path and length.
pub fn write_file(dir: &Path, key: &str, version: u64, value: &[u8], fsync: bool) -> Result<(PathBuf, u64)> {
    let (sub, name) = file_name(key, version);
    let sub = dir.join(sub);
    std::fs::create_dir_all(&sub).map_err(|e| io_err("creating", &sub, e))?;
    let path = sub.join(&name);
    let tmp = sub.join(format!("{name}.{:08x}{TMP_SUFFIX}", rand::random::<u32>()));
    let header =
        Header { key: key.to_string(), value_len: value.len() as u64, version, value_crc: crc32fast::hash(value) };
    let written = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(&header.encode())?;
        f.write_all(value)?;
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

/// Reads a file's value in order, piece by piece, checking the value's checksum at the end.
pub struct FileReader {
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
        let _ = fadvise(&file, header.data_offset(), None, Advice::Sequential);
        Ok(FileReader { file, header, pos: 0, crc: crc32fast::Hasher::new(), checked: false })
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
        self.file.read_exact_at(&mut buf[..n], at).map_err(|e| StoreError::Disk(format!("reading a file: {e}")))?;
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
