//! The fault-injecting in-memory directory the WAL's tests run on. `MemStorage` keeps every
//! file's written bytes apart from its synced bytes (and the directory's entries apart from the
//! synced directory), so a test can "crash" the machine, losing what was never synced or keeping
//! a torn prefix of it, and can make the Nth write fail the way a full or dying disk does. Compiled only with the `test-storage`
//! feature, which only dev-dependencies enable, so it never ships in the server binary.
//!
//! Free space is counted as a filesystem counts blocks: a file uses the larger of its length
//! and what `allocate` gave it; writes within an allocation cost nothing more, a truncate or
//! a removal gives space back.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::io::Errno;

use crate::storage::{Storage, StorageFile};

/// What survives a simulated crash beyond the synced bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crash {
    /// The process died (`kill -9`): the kernel keeps every written byte and directory change.
    Process,
    /// The machine lost power: only synced bytes and synced directory entries survive, plus up
    /// to this many bytes of each file's unsynced appended tail (a torn write).
    Power { torn_keep: usize },
}

#[derive(Default)]
struct MemFile {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Bytes given space by `allocate` (from offset 0), whatever the length.
    allocated: u64,
}

impl MemFile {
    /// The space the file takes.
    fn used(&self) -> u64 {
        (self.data.len() as u64).max(self.allocated)
    }
}

#[derive(Default)]
struct MemInner {
    files: HashMap<u64, MemFile>,
    dir: BTreeMap<String, u64>,
    durable_dir: BTreeMap<String, u64>,
    next_inode: u64,
    /// Writes so far (every file), numbering the writes that faults refer to.
    writes: u64,
    syncs: u64,
    /// Free space left: a write that does not fit writes what fits, then fails with ENOSPC.
    space_left: Option<u64>,
    /// The write with this number keeps only `.1` bytes and then the "process" is dead.
    die_at_write: Option<(u64, usize)>,
    /// The sync with this number fails with EIO.
    fail_sync_at: Option<u64>,
    /// After `die_at_write` fired every call fails: the process is gone.
    dead: bool,
    /// `allocate` fails with EOPNOTSUPP, as on a filesystem without `fallocate`.
    no_allocate: bool,
    /// Files moved by `set_aside`, as `folder/name` (durable at once).
    aside: BTreeMap<String, u64>,
}

impl MemInner {
    /// Space given back (a truncate, a removal) counts as free again.
    fn give_back(&mut self, bytes: u64) {
        if let Some(s) = &mut self.space_left {
            *s += bytes;
        }
    }
}

/// An in-memory directory with fault injection; clones share the same directory.
#[derive(Clone, Default)]
pub struct MemStorage {
    inner: Arc<Mutex<MemInner>>,
}

struct MemHandle {
    inner: Arc<Mutex<MemInner>>,
    inode: u64,
}

fn dead_err() -> io::Error {
    io::Error::other("simulated crash: the process is gone")
}

fn enospc() -> io::Error {
    Errno::NOSPC.into()
}

impl MemStorage {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemInner> {
        // A panicking test thread must not hide the directory from the next assertion.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Limits the free space to `bytes` (`None`: unlimited).
    pub fn set_space_left(&self, bytes: Option<u64>) {
        self.lock().space_left = bytes;
    }

    /// Makes `allocate` fail with EOPNOTSUPP (`true`), as a filesystem without `fallocate`.
    pub fn set_allocate_unsupported(&self, unsupported: bool) {
        self.lock().no_allocate = unsupported;
    }

    /// Free space left (`None`: unlimited).
    pub fn space_left(&self) -> Option<u64> {
        self.lock().space_left
    }

    /// The bytes of `name` that have space: its length or its allocation, the larger.
    pub fn allocated(&self, name: &str) -> Option<u64> {
        let g = self.lock();
        g.dir.get(name).map(|i| g.files[i].used())
    }

    /// The `n`th write from now (1 = the next) keeps only `keep` bytes, then every call fails.
    pub fn die_at_write(&self, n: u64, keep: usize) {
        let mut g = self.lock();
        g.die_at_write = Some((g.writes + n, keep));
    }

    /// The `n`th sync from now (1 = the next) fails with EIO.
    pub fn fail_sync_at(&self, n: u64) {
        let mut g = self.lock();
        g.fail_sync_at = Some(g.syncs + n);
    }

    /// Writes done so far.
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// File syncs done so far (directory syncs not counted).
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Simulates a crash and a reboot: afterwards the directory holds what survived, every
    /// fault is cleared, and handles opened before keep writing into files no name reaches.
    pub fn crash(&self, how: Crash) {
        let mut g = self.lock();
        let g = &mut *g;
        if let Crash::Power { torn_keep } = how {
            g.dir = g.durable_dir.clone();
            for f in g.files.values_mut() {
                let mut survived = f.durable.clone();
                if f.data.len() > f.durable.len() && f.data.starts_with(&f.durable) {
                    let tail = &f.data[f.durable.len()..];
                    survived.extend_from_slice(&tail[..torn_keep.min(tail.len())]);
                }
                f.data = survived;
            }
        }
        // Every surviving byte and entry is on disk after the reboot.
        for f in g.files.values_mut() {
            f.durable = f.data.clone();
        }
        g.durable_dir = g.dir.clone();
        // Old handles must not change the files the next process opens: move survivors to new
        // inodes.
        let mut files = HashMap::new();
        let mut dir = BTreeMap::new();
        for (name, inode) in &g.dir {
            let f = g.files.remove(inode).unwrap_or_default();
            g.next_inode += 1;
            files.insert(g.next_inode, f);
            dir.insert(name.clone(), g.next_inode);
        }
        // Files set aside were made durable when they moved.
        let aside = std::mem::take(&mut g.aside);
        for (path, inode) in aside {
            let f = g.files.remove(&inode).unwrap_or_default();
            g.next_inode += 1;
            files.insert(g.next_inode, f);
            g.aside.insert(path, g.next_inode);
        }
        g.files = files;
        g.durable_dir = dir.clone();
        g.dir = dir;
        g.space_left = None;
        g.no_allocate = false;
        g.die_at_write = None;
        g.fail_sync_at = None;
        g.dead = false;
    }

    /// The current bytes of `name` (what a reader would see now).
    pub fn contents(&self, name: &str) -> Option<Vec<u8>> {
        let g = self.lock();
        g.dir.get(name).map(|i| g.files[i].data.clone())
    }

    /// Overwrites one byte of `name` in place, as a disk that rots would.
    pub fn corrupt(&self, name: &str, offset: usize, byte: u8) {
        let mut g = self.lock();
        let inode = g.dir[name];
        let f = g.files.get_mut(&inode).expect("named file exists");
        f.data[offset] = byte;
        f.durable = f.data.clone();
    }

    /// The files `set_aside` moved, as `folder/name`, in order.
    pub fn set_aside_files(&self) -> Vec<String> {
        self.lock().aside.keys().cloned().collect()
    }

    /// The bytes of a file set aside, named `folder/name`.
    pub fn aside_contents(&self, path: &str) -> Option<Vec<u8>> {
        let g = self.lock();
        g.aside.get(path).map(|i| g.files[i].data.clone())
    }

    /// Replaces `name` with `bytes`, as synced.
    pub fn put_file(&self, name: &str, bytes: Vec<u8>) {
        let mut g = self.lock();
        g.next_inode += 1;
        let inode = g.next_inode;
        g.files.insert(
            inode,
            MemFile {
                data: bytes.clone(),
                durable: bytes,
                allocated: 0,
            },
        );
        g.dir.insert(name.to_owned(), inode);
        g.durable_dir.insert(name.to_owned(), inode);
    }

    fn check_alive(g: &MemInner) -> io::Result<()> {
        if g.dead {
            Err(dead_err())
        } else {
            Ok(())
        }
    }
}

impl Storage for MemStorage {
    fn create(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let mut g = self.lock();
        Self::check_alive(&g)?;
        g.next_inode += 1;
        let inode = g.next_inode;
        g.files.insert(inode, MemFile::default());
        if let Some(old) = g.dir.insert(name.to_owned(), inode) {
            let used = g.files[&old].used();
            g.give_back(used);
        }
        Ok(Arc::new(MemHandle {
            inner: self.inner.clone(),
            inode,
        }))
    }
    fn open_append(&self, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let g = self.lock();
        Self::check_alive(&g)?;
        let inode = *g
            .dir
            .get(name)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Arc::new(MemHandle {
            inner: self.inner.clone(),
            inode,
        }))
    }
    fn open_read(&self, name: &str) -> io::Result<Box<dyn Read + Send>> {
        let g = self.lock();
        Self::check_alive(&g)?;
        let inode = g
            .dir
            .get(name)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Box::new(io::Cursor::new(g.files[inode].data.clone())))
    }
    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut g = self.lock();
        Self::check_alive(&g)?;
        let inode = g
            .dir
            .remove(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        g.dir.insert(to.to_owned(), inode);
        Ok(())
    }
    fn remove(&self, name: &str) -> io::Result<()> {
        let mut g = self.lock();
        Self::check_alive(&g)?;
        let inode = g
            .dir
            .remove(name)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let used = g.files[&inode].used();
        g.give_back(used);
        Ok(())
    }
    fn list(&self) -> io::Result<Vec<String>> {
        let g = self.lock();
        Self::check_alive(&g)?;
        Ok(g.dir.keys().cloned().collect())
    }
    fn sync_dir(&self) -> io::Result<()> {
        let mut g = self.lock();
        Self::check_alive(&g)?;
        g.durable_dir = g.dir.clone();
        Ok(())
    }
    fn set_aside(&self, names: &[String], folder: &str) -> io::Result<()> {
        let mut g = self.lock();
        Self::check_alive(&g)?;
        let prefix = format!("{folder}/");
        if g.aside.keys().any(|k| k.starts_with(&prefix)) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        for n in names {
            let inode = g
                .dir
                .remove(n)
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
            g.durable_dir.remove(n);
            g.aside.insert(format!("{prefix}{n}"), inode);
        }
        Ok(())
    }
}

impl MemHandle {
    fn lock(&self) -> MutexGuard<'_, MemInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl StorageFile for MemHandle {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let mut g = self.lock();
        let g = &mut *g;
        MemStorage::check_alive(g)?;
        g.writes += 1;
        let mut len = buf.len();
        let mut result = Ok(());
        if let Some((n, keep)) = g.die_at_write {
            if g.writes == n {
                len = len.min(keep);
                g.dead = true;
                result = Err(dead_err());
            }
        }
        let f = g.files.get_mut(&self.inode).expect("open file exists");
        if let Some(space) = g.space_left {
            // Bytes within the file's allocation are paid for already.
            let covered = f.allocated.saturating_sub(f.data.len() as u64);
            if (len as u64) > covered + space {
                len = (covered + space) as usize;
                result = Err(enospc());
            }
            g.space_left = Some(space - (len as u64).saturating_sub(covered));
        }
        f.data.extend_from_slice(&buf[..len]);
        result
    }
    /// One write of the concatenation: a fault tears it at any byte, as a real `writev` may.
    fn write_all_vectored(&self, bufs: &[&[u8]]) -> io::Result<()> {
        self.write_all(&bufs.concat())
    }
    fn sync(&self) -> io::Result<()> {
        let mut g = self.lock();
        MemStorage::check_alive(&g)?;
        g.syncs += 1;
        if g.fail_sync_at == Some(g.syncs) {
            return Err(Errno::IO.into());
        }
        let f = g.files.get_mut(&self.inode).expect("open file exists");
        f.durable = f.data.clone();
        Ok(())
    }
    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut g = self.lock();
        MemStorage::check_alive(&g)?;
        let f = g.files.get_mut(&self.inode).expect("open file exists");
        let before = f.used();
        f.data.truncate(len as usize);
        f.allocated = f.allocated.min(len);
        let freed = before - f.used();
        g.give_back(freed);
        Ok(())
    }
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut g = self.lock();
        let g = &mut *g;
        MemStorage::check_alive(g)?;
        if g.no_allocate {
            return Err(Errno::OPNOTSUPP.into());
        }
        let f = g.files.get_mut(&self.inode).expect("open file exists");
        let end = offset + len;
        let extra = end.saturating_sub(f.used());
        if let Some(space) = g.space_left {
            if extra > space {
                return Err(enospc());
            }
            g.space_left = Some(space - extra);
        }
        f.allocated = f.allocated.max(end);
        Ok(())
    }
    fn trim(&self) -> io::Result<()> {
        let len = {
            let g = self.lock();
            MemStorage::check_alive(&g)?;
            g.files[&self.inode].data.len() as u64
        };
        self.truncate(len)
    }
}
