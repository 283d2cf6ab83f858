//! A size-limited tmpfs of the test's own, for the disk tier's full-disk tests: a file system
//! that fills up (ENOSPC) at a size the test picks, grows or shrinks when remounted, and can
//! be made read-only. Mounting needs root: [`Tmpfs::mount`] says why it cannot otherwise.

use std::path::Path;

/// A tmpfs mounted on a temporary directory, unmounted when dropped.
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`: `6M`, bytes, ...); `Err(why)` when this
    /// process cannot (not root, no `mount`): the caller skips ([`crate::skip`]).
    pub fn mount(size: &str) -> Result<Tmpfs, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("mounting a tmpfs needs root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
        let fs = Tmpfs(dir);
        fs.mount_cmd(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])?;
        Ok(fs)
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Bytes in use on the file system.
    pub fn used(&self) -> u64 {
        let st = rustix::fs::statvfs(self.path()).expect("statvfs");
        (st.f_blocks - st.f_bfree) * st.f_frsize
    }

    /// Remounts it with another size (it cannot shrink below what is in use).
    pub fn resize(&self, size: &str) {
        self.mount_cmd(&["-o", &format!("remount,size={size}")]).unwrap();
    }

    /// Remounts it read-only.
    pub fn read_only(&self) {
        self.mount_cmd(&["-o", "remount,ro"]).unwrap();
    }

    /// Fills what is free with the file `name` (written until the file system refuses with
    /// ENOSPC), as other programs fill a shared disk; deleting it gives the room back.
    pub fn fill(&self, name: &str) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join(name)).expect("creating the filler");
        let chunk = vec![0x5au8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => panic!("the filler wrote nothing without an error"),
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => return,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
    }

    fn mount_cmd(&self, args: &[&str]) -> Result<(), String> {
        let out = std::process::Command::new("mount")
            .args(args)
            .arg(self.path())
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("mount {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.path()).status();
    }
}
