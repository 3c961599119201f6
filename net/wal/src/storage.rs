//! The directory the WAL and snapshots live in, behind a small trait: `FsStorage` is the real
//! disk; `mem_storage::MemStorage` (feature `test-storage`) is a fault-injecting stand-in for
//! tests.
//! What goes into the files is `format`'s business; when to sync is `Wal`'s.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory of files. Names are plain file names, never paths.
pub trait Storage: Send + Sync + 'static {
    /// Creates `name` empty (replacing any file of that name), open for appending.
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens an existing `name` for appending at its end.
    fn open_append(&self, name: &str) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens `name` for reading from its start.
    fn open_read(&self, name: &str) -> io::Result<Box<dyn Read + Send>>;
    /// Replaces `to` by `from` atomically (durable once `sync_dir` returns).
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn remove(&self, name: &str) -> io::Result<()>;
    /// The names of every file in the directory, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Makes creations, renames and removals so far durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// Moves `names` into a new sub-directory `folder`, out of `list`'s sight but kept, and
    /// makes the move durable. Fails with `AlreadyExists` when `folder` exists: files set
    /// aside are never replaced.
    fn set_aside(&self, names: &[String], folder: &str) -> io::Result<()>;
}

/// One open file. Methods take `&self` so the loop can write while the sync thread syncs the
/// same file (a write that returned before `sync` started is covered by it).
pub trait StorageFile: Send + Sync {
    /// Appends all of `buf`; on error a prefix of it may have been written.
    fn write_all(&self, buf: &[u8]) -> io::Result<()>;
    /// Appends all of `bufs`, in order, as one write would (`writev`): a record whose big
    /// payload is held apart goes out without being copied together first. On error a prefix
    /// of their concatenation may have been written.
    fn write_all_vectored(&self, bufs: &[&[u8]]) -> io::Result<()>;
    /// Makes every byte written before the call durable.
    fn sync(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (used to cut a torn tail at recovery).
    fn truncate(&self, len: u64) -> io::Result<()>;
    /// Gives the bytes `offset..offset + len` disk space without changing the file's length
    /// (`fallocate` with `FALLOC_FL_KEEP_SIZE`): a later append within them cannot fail for
    /// lack of room. Fails as a write there would — `ENOSPC`, `EDQUOT`, `EFBIG` past the
    /// process's file size limit — or with `EOPNOTSUPP` where the filesystem cannot.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Gives back the space allocated past the file's end (a truncate to its own length).
    fn trim(&self) -> io::Result<()>;
}

/// The real directory on disk.
pub struct FsStorage {
    dir: PathBuf,
}

impl FsStorage {
    /// Uses `dir`, creating it when missing.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

struct FsFile(File);

impl StorageFile for FsFile {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        // `&File` is `Write`; the file is opened with O_APPEND so every write lands at the end.
        (&self.0).write_all(buf)
    }
    fn write_all_vectored(&self, bufs: &[&[u8]]) -> io::Result<()> {
        let mut slices: Vec<IoSlice<'_>> = bufs.iter().map(|b| IoSlice::new(b)).collect();
        let mut rest = &mut slices[..];
        // Drops leading empty slices, so an empty rest means all is written.
        IoSlice::advance_slices(&mut rest, 0);
        while !rest.is_empty() {
            match (&self.0).write_vectored(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut rest, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        use rustix::process::{getrlimit, Resource};
        // `fallocate` ignores RLIMIT_FSIZE when the length stays; the write would not.
        let end = offset.saturating_add(len);
        if getrlimit(Resource::Fsize)
            .current
            .is_some_and(|limit| end > limit)
        {
            return Err(rustix::io::Errno::FBIG.into());
        }
        rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::KEEP_SIZE, offset, len)
            .map_err(io::Error::from)
    }
    fn trim(&self) -> io::Result<()> {
        // A truncate to the same length frees the blocks past it (ext4, XFS, tmpfs).
        self.0.set_len(self.0.metadata()?.len())
    }
}

impl Storage for FsStorage {
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        // O_APPEND by hand: std refuses `append` together with `truncate`.
        let f = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .custom_flags(rustix::fs::OFlags::APPEND.bits() as i32)
            .open(self.dir.join(name))?;
        Ok(Arc::new(FsFile(f)))
    }
    fn open_append(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let f = OpenOptions::new().append(true).open(self.dir.join(name))?;
        Ok(Arc::new(FsFile(f)))
    }
    fn open_read(&self, name: &str) -> io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(File::open(self.dir.join(name))?))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.dir.join(from), self.dir.join(to))
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.dir.join(name))
    }
    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_owned());
                }
            }
        }
        Ok(names)
    }
    fn sync_dir(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }
    fn set_aside(&self, names: &[String], folder: &str) -> io::Result<()> {
        let to = self.dir.join(folder);
        fs::create_dir(&to)?;
        for n in names {
            fs::rename(self.dir.join(n), to.join(n))?;
        }
        File::open(&to)?.sync_all()?;
        self.sync_dir()
    }
}

/// Reads a whole file (WAL segments are bounded by `SEGMENT_BYTES` plus one batch).
pub fn read_all(storage: &dyn Storage, name: &str) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    storage.open_read(name)?.read_to_end(&mut buf)?;
    Ok(buf)
}
