//! The data directory's lock file: one `tarq` per directory. `flock` is released by the kernel
//! when the process dies, so a crash never leaves a stale lock behind; the pid written into
//! the file only makes the refusal message useful.

use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use super::WalError;

pub const LOCK_FILE: &str = "tarq.lock";

/// Held for as long as the process uses the directory.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Locks `dir` (creating it when missing), or says who holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock, WalError> {
        create_dir_durably(dir)
            .map_err(|e| WalError::io(format!("creating {}", dir.display()), e))?;
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| WalError::io(format!("opening {}", path.display()), e))?;
        if let Err(err) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
            if err == Errno::WOULDBLOCK {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                return Err(WalError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder.trim().to_owned(),
                });
            }
            return Err(WalError::io(
                format!("locking {}", path.display()),
                err.into(),
            ));
        }
        let pid = std::process::id();
        let written = file
            .set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{pid}"));
        written.map_err(|e| WalError::io(format!("writing {}", path.display()), e))?;
        Ok(DirLock { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Creates `dir` and each missing parent, fsyncing the parent of every directory it makes: a
/// directory's name is durable only once its parent is synced, so without it a power loss
/// soon after the first start takes the whole data directory back, acknowledged tasks and all
/// (chaos/tests/lazyfs.rs saw it with `--wal-mode fsync`).
pub fn create_dir_durably(dir: &std::path::Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d);
        at = d.parent();
    }
    for d in missing.into_iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let parent = match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}
