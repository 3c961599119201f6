//! The filesystem's state and its operations, in plain `io::Result` terms (the FUSE glue in
//! `ops` only unpacks requests and packs replies). It is a passthrough: every operation is
//! applied to the backing directory at once, after telling the [`Journal`] what it is about to
//! change, so a power loss can take back what was not made durable.
//!
//! Inodes are the backing directory's own, each known by an `O_PATH` descriptor (as libfuse's
//! `passthrough_ll` does): operations go through `*at` calls relative to a directory's
//! descriptor, so a rename anywhere above never leaves a stale path behind, and the descriptor
//! pins the backing inode so its number is not reused while the kernel still knows it. FUSE
//! inode numbers are handed out from a counter and never reused.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{File, FileTimes, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};
use rustix::fs::{FallocateFlags, Mode, OFlags, RenameFlags};

use super::journal::{self, DirRef, Journal, Key, Lost, TRASH};

/// What the kernel knows of one backing inode.
struct Node {
    fd: Arc<File>,
    key: Key,
    /// The kernel's lookup count: the node is dropped when `forget` brings it to zero.
    lookups: u64,
}

/// One open file or directory.
enum Handle {
    File {
        /// The backing inode: the kernel keeps the inode while the file is open, but the
        /// handle must not depend on it.
        key: Key,
        file: Arc<File>,
        /// Opened with `O_SYNC` or `O_DSYNC`: every write is durable when it returns.
        sync: bool,
    },
    /// A directory's entries as they were at `opendir`, so offsets stay meaningful.
    Dir(Vec<DirEntry>),
}

/// One entry of a directory listing.
pub(super) struct DirEntry {
    pub name: OsString,
    pub ino: u64,
    pub kind: FileType,
}

/// New values for `setattr`; `None` leaves one as it is.
#[derive(Default)]
pub(super) struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SystemTime>,
    pub mtime: Option<SystemTime>,
}

pub(super) struct State {
    nodes: HashMap<u64, Node>,
    by_key: HashMap<Key, u64>,
    next_ino: u64,
    handles: HashMap<u64, Handle>,
    next_fh: u64,
    journal: Journal,
    root_key: Key,
}

impl State {
    pub fn new(backing: &Path) -> io::Result<State> {
        let root = File::open(backing)?;
        if !root.metadata()?.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                backing.display()
            )));
        }
        let root_key = journal::key_of(&root)?;
        let root = Node {
            fd: Arc::new(root),
            key: root_key,
            // The root is never forgotten.
            lookups: u64::MAX / 2,
        };
        Ok(State {
            nodes: HashMap::from([(INodeNo::ROOT.0, root)]),
            by_key: HashMap::from([(root_key, INodeNo::ROOT.0)]),
            next_ino: INodeNo::ROOT.0 + 1,
            handles: HashMap::new(),
            next_fh: 1,
            journal: Journal::new(backing)?,
            root_key,
        })
    }

    /// The FUSE inode numbers the kernel may have cached something of.
    pub fn inodes(&self) -> Vec<u64> {
        self.nodes.keys().copied().collect()
    }

    /// How many files are open through the mount.
    pub fn open_files(&self) -> usize {
        let files = self.handles.values();
        files.filter(|h| matches!(h, Handle::File { .. })).count()
    }

    pub fn lose(&mut self) -> io::Result<Lost> {
        self.journal.lose()
    }

    pub fn keep_all(&mut self) -> io::Result<()> {
        self.journal.keep_all()
    }

    pub fn lookup(&mut self, parent: u64, name: &OsStr) -> io::Result<FileAttr> {
        if self.hidden(parent, name) {
            return Err(errno(libc::ENOENT));
        }
        let fd = journal::open_path(&self.node(parent)?.fd, name)?;
        self.remember(fd)
    }

    pub fn forget(&mut self, ino: u64, count: u64) {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(count);
        if node.lookups == 0 {
            let key = node.key;
            self.nodes.remove(&ino);
            self.by_key.remove(&key);
        }
    }

    pub fn getattr(&self, ino: u64) -> io::Result<FileAttr> {
        attr(ino, &self.node(ino)?.fd.metadata()?)
    }

    pub fn setattr(&mut self, ino: u64, fh: Option<u64>, set: SetAttr) -> io::Result<FileAttr> {
        let node = self.node(ino)?;
        let (key, path) = (node.key, proc_path(&node.fd));
        if let Some(size) = set.size {
            let file = match fh.and_then(|fh| self.open_file(fh).ok()) {
                Some(file) => file,
                None => Arc::new(OpenOptions::new().write(true).open(&path)?),
            };
            let now = file.metadata()?.len();
            self.journal.changing(key, &file, now.min(size)..u64::MAX)?;
            file.set_len(size)?;
        }
        if let Some(mode) = set.mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            std::os::unix::fs::chown(&path, set.uid, set.gid)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            set_times(&path, set.atime, set.mtime)?;
        }
        self.getattr(ino)
    }

    pub fn readlink(&self, ino: u64) -> io::Result<Vec<u8>> {
        let target = rustix::fs::readlinkat(&*self.node(ino)?.fd, "", Vec::new())?;
        Ok(target.into_bytes())
    }

    pub fn mkdir(&mut self, parent: u64, name: &OsStr, mode: u32) -> io::Result<FileAttr> {
        let dir = self.dir_for_new(parent, name)?;
        rustix::fs::mkdirat(&*dir.fd, name, Mode::from_raw_mode(mode))?;
        self.made(dir, name)
    }

    pub fn symlink(&mut self, parent: u64, name: &OsStr, target: &Path) -> io::Result<FileAttr> {
        let dir = self.dir_for_new(parent, name)?;
        rustix::fs::symlinkat(target, &*dir.fd, name)?;
        self.made(dir, name)
    }

    /// `open(O_CREAT)` of a name the kernel found absent: creates it (or, raced, opens it).
    pub fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
    ) -> io::Result<(FileAttr, u64)> {
        let dir = self.dir_for_new(parent, name)?;
        let oflags = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC;
        let attr = match rustix::fs::openat(&*dir.fd, name, oflags, Mode::from_raw_mode(mode)) {
            Ok(_) => self.made(dir, name)?,
            Err(rustix::io::Errno::EXIST) if flags & libc::O_EXCL == 0 => {
                let attr = self.lookup(parent, name)?;
                if flags & libc::O_TRUNC != 0 {
                    let set = SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    };
                    self.setattr(attr.ino.0, None, set)?;
                }
                attr
            }
            Err(e) => return Err(e.into()),
        };
        let fh = self.open(attr.ino.0, flags)?;
        Ok((attr, fh))
    }

    /// `unlink` (`dir` false) or `rmdir` (`dir` true): the inode goes to the trash.
    pub fn remove(&mut self, parent: u64, name: &OsStr, dir: bool) -> io::Result<()> {
        let parent_dir = self.dir_for_new(parent, name)?;
        let victim = journal::open_path(&parent_dir.fd, name)?;
        let is_dir = victim.metadata()?.is_dir();
        match (dir, is_dir) {
            (false, true) => return Err(errno(libc::EISDIR)),
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (true, true) if !is_empty(&victim)? => return Err(errno(libc::ENOTEMPTY)),
            _ => {}
        }
        let trashed = self.journal.move_to_trash(&parent_dir.fd, name)?;
        self.journal.removed(parent_dir, name, trashed);
        Ok(())
    }

    /// `rename(from/from_name, to/to_name)`, keeping what it replaces in the trash. The
    /// replacement is two atomic steps: exchange the two names, then move the replaced inode
    /// (now at `from_name`) to the trash. The checks `rename` itself would make come first,
    /// since an exchange succeeds where a rename fails.
    pub fn rename(
        &mut self,
        (from, from_name): (u64, &OsStr),
        (to, to_name): (u64, &OsStr),
        flags: u32,
    ) -> io::Result<()> {
        if flags & !RenameFlags::NOREPLACE.bits() != 0 {
            return Err(errno(libc::EINVAL));
        }
        let from_dir = self.dir_for_new(from, from_name)?;
        let to_dir = self.dir_for_new(to, to_name)?;
        let moved = journal::open_path(&from_dir.fd, from_name)?.metadata()?;
        let replaced = match journal::open_path(&to_dir.fd, to_name) {
            Ok(target) => Some(target),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
            Err(e) => return Err(e),
        };
        let Some(target) = replaced else {
            journal::rename(&from_dir.fd, from_name, &to_dir.fd, to_name)?;
            self.journal
                .renamed((from_dir, from_name), (to_dir, to_name), None);
            return Ok(());
        };
        if flags & RenameFlags::NOREPLACE.bits() != 0 {
            return Err(errno(libc::EEXIST));
        }
        let target_md = target.metadata()?;
        if (moved.dev(), moved.ino()) == (target_md.dev(), target_md.ino()) {
            return Ok(()); // Two names of one inode: rename does nothing.
        }
        match (moved.is_dir(), target_md.is_dir()) {
            (false, true) => return Err(errno(libc::EISDIR)),
            (true, false) => return Err(errno(libc::ENOTDIR)),
            (true, true) if !is_empty(&target)? => return Err(errno(libc::ENOTEMPTY)),
            _ => {}
        }
        rustix::fs::renameat_with(
            &*from_dir.fd,
            from_name,
            &*to_dir.fd,
            to_name,
            RenameFlags::EXCHANGE,
        )?;
        let trashed = self.journal.move_to_trash(&from_dir.fd, from_name)?;
        let (from, to) = ((from_dir, from_name), (to_dir, to_name));
        self.journal.renamed(from, to, Some(trashed));
        Ok(())
    }

    /// Opens the file `ino`. The backing file is opened read-write whatever was asked (the
    /// kernel has checked the caller's access already; the journal needs to read old bytes),
    /// and without `O_APPEND`: the kernel sends every write with its offset, and `pwrite` on
    /// an `O_APPEND` descriptor would ignore it.
    pub fn open(&mut self, ino: u64, flags: i32) -> io::Result<u64> {
        let node = self.node(ino)?;
        let (key, path) = (node.key, proc_path(&node.fd));
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            // Not root, say: then the access asked for is the one to be had.
            Err(_) => OpenOptions::new()
                .read(flags & libc::O_ACCMODE != libc::O_WRONLY)
                .write(flags & libc::O_ACCMODE != libc::O_RDONLY)
                .open(&path)?,
        };
        let sync = flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let file = Arc::new(file);
        Ok(self.add_handle(Handle::File { key, file, sync }))
    }

    pub fn read(&self, fh: u64, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        let file = self.open_file(fh)?;
        let mut buf = vec![0; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match file.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    pub fn write(&mut self, fh: u64, offset: u64, data: &[u8]) -> io::Result<u32> {
        let (key, file, sync) = self.file_handle(fh)?;
        let end = offset.saturating_add(data.len() as u64);
        self.journal.changing(key, &file, offset..end)?;
        file.write_all_at(data, offset)?;
        if sync {
            self.journal.file_synced(key);
        }
        u32::try_from(data.len()).map_err(io::Error::other)
    }

    /// `fallocate`. Only the modes that can change bytes (punching, zeroing, collapsing,
    /// inserting) save old pages; plain allocation only ever changes the length.
    pub fn fallocate(&mut self, fh: u64, offset: u64, len: u64, mode: i32) -> io::Result<()> {
        let (key, file, _) = self.file_handle(fh)?;
        let flags = FallocateFlags::from_bits_retain(mode as u32);
        let changes_bytes = !(flags - FallocateFlags::KEEP_SIZE).is_empty();
        let start = if changes_bytes { offset } else { u64::MAX };
        self.journal.changing(key, &file, start..u64::MAX)?;
        rustix::fs::fallocate(&*file, flags, offset, len)?;
        Ok(())
    }

    pub fn release(&mut self, fh: u64) {
        self.handles.remove(&fh);
    }

    /// `fsync`/`fdatasync` of a file: its data and length become durable. The backing file
    /// itself is not synced: the loss is simulated, and the test machine's disk is not at stake.
    pub fn fsync(&mut self, ino: u64) -> io::Result<()> {
        let key = self.node(ino)?.key;
        self.journal.file_synced(key);
        Ok(())
    }

    /// `fsync` of a directory: the names made, removed and renamed in it become durable.
    pub fn fsyncdir(&mut self, ino: u64) -> io::Result<()> {
        let key = self.node(ino)?.key;
        self.journal.dir_synced(key)
    }

    pub fn opendir(&mut self, ino: u64) -> io::Result<u64> {
        let node = self.node(ino)?;
        let is_root = node.key == self.root_key;
        let mut entries = vec![
            DirEntry {
                name: ".".into(),
                ino,
                kind: FileType::Directory,
            },
            DirEntry {
                name: "..".into(),
                ino,
                kind: FileType::Directory,
            },
        ];
        for entry in std::fs::read_dir(proc_path(&node.fd))? {
            let entry = entry?;
            if is_root && entry.file_name() == TRASH {
                continue;
            }
            let kind = FileType::from_std(entry.file_type()?).unwrap_or(FileType::RegularFile);
            let (name, ino) = (entry.file_name(), entry.ino());
            entries.push(DirEntry { name, ino, kind });
        }
        Ok(self.add_handle(Handle::Dir(entries)))
    }

    pub fn readdir(&self, fh: u64) -> io::Result<&[DirEntry]> {
        match self.handles.get(&fh) {
            Some(Handle::Dir(entries)) => Ok(entries),
            _ => Err(errno(libc::EBADF)),
        }
    }

    pub fn statfs(&self) -> io::Result<rustix::fs::StatVfs> {
        let root = &self.nodes[&INodeNo::ROOT.0];
        Ok(rustix::fs::fstatvfs(&*root.fd)?)
    }

    fn node(&self, ino: u64) -> io::Result<&Node> {
        self.nodes.get(&ino).ok_or_else(|| errno(libc::ESTALE))
    }

    fn open_file(&self, fh: u64) -> io::Result<Arc<File>> {
        self.file_handle(fh).map(|(_, file, _)| file)
    }

    /// The open file `fh`: its inode, its backing file, and whether its writes are synchronous.
    fn file_handle(&self, fh: u64) -> io::Result<(Key, Arc<File>, bool)> {
        match self.handles.get(&fh) {
            Some(Handle::File { key, file, sync }) => Ok((*key, file.clone(), *sync)),
            _ => Err(errno(libc::EBADF)),
        }
    }

    fn add_handle(&mut self, handle: Handle) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, handle);
        fh
    }

    /// The trash is not part of the filesystem: invisible, and no name may be made over it.
    fn hidden(&self, parent: u64, name: &OsStr) -> bool {
        name.as_bytes() == TRASH.as_bytes()
            && self
                .nodes
                .get(&parent)
                .is_some_and(|p| p.key == self.root_key)
    }

    /// The directory `parent`, where `name` is to be made, removed or renamed.
    fn dir_for_new(&self, parent: u64, name: &OsStr) -> io::Result<DirRef> {
        if self.hidden(parent, name) {
            return Err(errno(libc::EACCES));
        }
        let node = self.node(parent)?;
        Ok(DirRef {
            key: node.key,
            fd: node.fd.clone(),
        })
    }

    /// After `name` was made in `dir`: journals it and answers its attributes.
    fn made(&mut self, dir: DirRef, name: &OsStr) -> io::Result<FileAttr> {
        let fd = journal::open_path(&dir.fd, name)?;
        self.journal.created(dir, name);
        self.remember(fd)
    }

    /// Counts one more kernel lookup of the inode `fd` refers to, known or new.
    fn remember(&mut self, fd: File) -> io::Result<FileAttr> {
        let md = fd.metadata()?;
        let key = (md.dev(), md.ino());
        let ino = match self.by_key.get(&key) {
            Some(&ino) => ino,
            None => {
                let ino = self.next_ino;
                self.next_ino += 1;
                let fd = Arc::new(fd);
                let node = Node {
                    fd,
                    key,
                    lookups: 0,
                };
                self.nodes.insert(ino, node);
                self.by_key.insert(key, ino);
                ino
            }
        };
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.lookups += 1;
        }
        attr(ino, &md)
    }
}

/// The path through which the inode behind an `O_PATH` descriptor can be opened for I/O.
fn proc_path(fd: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn is_empty(dir: &File) -> io::Result<bool> {
    Ok(std::fs::read_dir(proc_path(dir))?.next().is_none())
}

fn set_times(path: &Path, atime: Option<SystemTime>, mtime: Option<SystemTime>) -> io::Result<()> {
    let mut times = FileTimes::new();
    if let Some(t) = atime {
        times = times.set_accessed(t);
    }
    if let Some(t) = mtime {
        times = times.set_modified(t);
    }
    File::open(path)?.set_times(times)
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// The backing inode's attributes, under the FUSE inode number `ino`.
fn attr(ino: u64, md: &Metadata) -> io::Result<FileAttr> {
    let narrow = |v: u64| u32::try_from(v).map_err(io::Error::other);
    Ok(FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: md.accessed().unwrap_or(UNIX_EPOCH),
        mtime: md.modified().unwrap_or(UNIX_EPOCH),
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: FileType::from_std(md.file_type()).unwrap_or(FileType::RegularFile),
        perm: (md.mode() & 0o7777) as u16,
        nlink: narrow(md.nlink())?,
        uid: md.uid(),
        gid: md.gid(),
        rdev: narrow(md.rdev())?,
        blksize: narrow(md.blksize())?,
        flags: 0,
    })
}

fn time(secs: i64, nanos: i64) -> SystemTime {
    match (u64::try_from(secs), u32::try_from(nanos)) {
        (Ok(s), Ok(n)) => UNIX_EPOCH + Duration::new(s, n),
        _ => UNIX_EPOCH,
    }
}
