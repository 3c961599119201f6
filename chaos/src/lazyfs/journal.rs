//! What has been done to the backing directory since it was last made durable, and how to
//! take it back. The filesystem applies every operation to the backing directory at once, so
//! the backing directory is always the *current* state; this journal holds just enough of the
//! *durable* state beside it to return there on a power loss:
//!
//! - for each file written, truncated or allocated since its last `fsync`, the length it had
//!   then and the old bytes of every 4 KiB page below that length it has changed since (saved
//!   once, on the first change of the page);
//! - the namespace operations (create, mkdir, symlink, unlink, rmdir, rename) not yet made
//!   durable by an `fsync` of their directory, oldest first. What an unlink or a replacing
//!   rename takes away is not deleted but moved into a hidden trash directory inside the
//!   backing directory, so that undoing the operation can put the very same inode back.
//!
//! `fsync`/`fdatasync` of a file forgets its saved pages (its data and length are durable).
//! `fsyncdir` of a directory commits its pending namespace operations, and deletes for good what
//! they had moved into the trash. [`Journal::lose`] writes the saved pages back, cuts each file
//! to its durable length, and undoes the pending namespace operations newest first.
//!
//! Undoing newest first is exact because of one invariant: for every directory, the operations
//! that touch it and are durable come before the ones that are not. A plain `fsyncdir(D)` keeps
//! it by committing every pending operation in `D`. A rename across two directories touches
//! both; committing it through one of them (ext4 journals a rename as one transaction) also
//! commits what came before it in the other, and so on transitively. So when an operation is
//! undone, every later operation in its directories has been undone already, and the names it
//! changed hold exactly what it left there.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, RenameFlags};

/// A backing inode's identity: `(st_dev, st_ino)`. Stable across renames, and never reused
/// while the journal holds a descriptor of the inode.
pub(super) type Key = (u64, u64);

/// The hidden directory inside the backing directory where unlinked and replaced inodes wait
/// until their removal is durable (then they are deleted) or lost (then they are put back).
pub(super) const TRASH: &str = ".lazyfs-trash";

/// The unit of saved old data: what a page cache would write back as one.
const PAGE: u64 = 4096;

/// A directory the journal refers to: its identity, and a descriptor (`O_PATH`) that works
/// wherever the directory has been moved since.
#[derive(Clone)]
pub(super) struct DirRef {
    pub key: Key,
    pub fd: Arc<File>,
}

/// A namespace operation not yet durable.
enum NameOp {
    /// `name` was made in `dir` (a file, directory or symlink).
    Created { dir: DirRef, name: OsString },
    /// `name` was taken out of `dir`; the inode waits in the trash as `trashed`.
    Removed {
        dir: DirRef,
        name: OsString,
        trashed: OsString,
    },
    /// `from/from_name` became `to/to_name`; what `to_name` held waits in the trash.
    Renamed {
        from: DirRef,
        from_name: OsString,
        to: DirRef,
        to_name: OsString,
        replaced: Option<OsString>,
    },
}

impl NameOp {
    /// The directories whose entries the operation changed.
    fn dirs(&self) -> [Option<Key>; 2] {
        match self {
            NameOp::Created { dir, .. } | NameOp::Removed { dir, .. } => [Some(dir.key), None],
            NameOp::Renamed { from, to, .. } => [Some(from.key), Some(to.key)],
        }
    }

    fn touches_any(&self, dirs: &[Key]) -> bool {
        self.dirs().iter().flatten().any(|d| dirs.contains(d))
    }

    /// The trash entry the operation keeps alive, if any.
    fn trashed(&self) -> Option<&OsStr> {
        match self {
            NameOp::Removed { trashed, .. } => Some(trashed),
            NameOp::Renamed { replaced, .. } => replaced.as_deref(),
            NameOp::Created { .. } => None,
        }
    }
}

/// A file changed since its last `fsync`: its durable length and the durable bytes of the pages
/// changed since.
struct DirtyFile {
    file: Arc<File>,
    durable_len: u64,
    saved: BTreeMap<u64, Vec<u8>>,
}

/// What a [`Journal::lose`] took back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lost {
    /// Files whose unsynced data or length was rolled back.
    pub files: usize,
    /// Namespace operations undone.
    pub names: usize,
}

pub(super) struct Journal {
    backing: PathBuf,
    /// The trash directory, made when first needed and removed when nothing waits in it, so
    /// that a quiet backing directory holds only what the filesystem shows.
    trash: Option<DirRef>,
    next_trash: u64,
    names: Vec<NameOp>,
    files: HashMap<Key, DirtyFile>,
}

impl Journal {
    /// A journal over `backing`, whose whole present content is taken as durable. A trash left
    /// by an earlier run that did not end cleanly is deleted: what waited in it was removed.
    pub fn new(backing: &Path) -> io::Result<Journal> {
        let stale = backing.join(TRASH);
        if stale.symlink_metadata().is_ok() {
            std::fs::remove_dir_all(&stale)?;
        }
        Ok(Journal {
            backing: backing.to_path_buf(),
            trash: None,
            next_trash: 0,
            names: Vec::new(),
            files: HashMap::new(),
        })
    }

    /// Moves `dir/name` into the trash, returning its name there.
    pub fn move_to_trash(&mut self, dir: &File, name: &OsStr) -> io::Result<OsString> {
        let trash = self.trash_dir()?;
        self.next_trash += 1;
        let trashed = OsString::from(format!("t{}", self.next_trash));
        rename(dir, name, &trash.fd, &trashed)?;
        Ok(trashed)
    }

    pub fn created(&mut self, dir: DirRef, name: &OsStr) {
        let name = name.to_owned();
        self.names.push(NameOp::Created { dir, name });
    }

    pub fn removed(&mut self, dir: DirRef, name: &OsStr, trashed: OsString) {
        let name = name.to_owned();
        self.names.push(NameOp::Removed { dir, name, trashed });
    }

    pub fn renamed(
        &mut self,
        (from, from_name): (DirRef, &OsStr),
        (to, to_name): (DirRef, &OsStr),
        replaced: Option<OsString>,
    ) {
        self.names.push(NameOp::Renamed {
            from,
            from_name: from_name.to_owned(),
            to,
            to_name: to_name.to_owned(),
            replaced,
        });
    }

    /// Called before the bytes `range` of `file` (the inode `key`) change, `range.end` being
    /// `u64::MAX` when the length changes too: saves the durable bytes of every page of the
    /// range that has not been saved since the last `fsync`. Bytes at or past the durable
    /// length need no saving: the loss cuts the file there.
    pub fn changing(&mut self, key: Key, file: &Arc<File>, range: Range<u64>) -> io::Result<()> {
        let dirty = match self.files.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(DirtyFile {
                durable_len: file.metadata()?.len(),
                file: file.clone(),
                saved: BTreeMap::new(),
            }),
        };
        let end = range.end.min(dirty.durable_len);
        let mut page = range.start / PAGE * PAGE;
        while page < end {
            if let std::collections::btree_map::Entry::Vacant(slot) = dirty.saved.entry(page) {
                let len = PAGE.min(dirty.durable_len - page);
                slot.insert(read_at(&dirty.file, page, len)?);
            }
            page += PAGE;
        }
        Ok(())
    }

    /// `fsync` or `fdatasync` of the inode `key`: its data and length are durable.
    pub fn file_synced(&mut self, key: Key) {
        self.files.remove(&key);
    }

    /// `fsyncdir` of the directory `key`: its pending namespace operations are durable, with
    /// those they bring along (see the module's doc). What they had trashed is deleted.
    pub fn dir_synced(&mut self, key: Key) -> io::Result<()> {
        let mut dirs = vec![key];
        let mut committed = Vec::new();
        // Newest first: an operation committed through a directory commits the earlier
        // operations of the other directory it touched, not the later ones.
        for i in (0..self.names.len()).rev() {
            if self.names[i].touches_any(&dirs) {
                dirs.extend(self.names[i].dirs().into_iter().flatten());
                committed.push(i);
            }
        }
        // `committed` is in descending order, so each removal leaves the others' indices valid.
        let ops: Vec<NameOp> = committed
            .into_iter()
            .map(|i| self.names.remove(i))
            .collect();
        let mut result = Ok(());
        for trashed in ops.iter().filter_map(NameOp::trashed) {
            result = result.and(self.delete_trashed(trashed));
        }
        result.and(self.drop_trash_if_unused())
    }

    /// The power loss: everything not durable is taken back (see the module's doc).
    pub fn lose(&mut self) -> io::Result<Lost> {
        let lost = Lost {
            files: self.files.len(),
            names: self.names.len(),
        };
        let mut result = Ok(());
        for (_, dirty) in self.files.drain() {
            result = result.and(restore(&dirty));
        }
        while let Some(op) = self.names.pop() {
            result = result.and(self.undo(op));
        }
        result.and(self.empty_trash()).map(|()| lost)
    }

    /// A clean shutdown: everything done so far is kept.
    pub fn keep_all(&mut self) -> io::Result<()> {
        self.files.clear();
        self.names.clear();
        self.empty_trash()
    }

    fn undo(&mut self, op: NameOp) -> io::Result<()> {
        match op {
            // What was made goes to the trash, which is emptied at the end of the loss: a
            // directory whose making was not durable takes its whole subtree with it.
            NameOp::Created { dir, name } => self.move_to_trash(&dir.fd, &name).map(drop),
            NameOp::Removed { dir, name, trashed } => {
                rename(&self.trash_dir()?.fd, &trashed, &dir.fd, &name)
            }
            NameOp::Renamed {
                from,
                from_name,
                to,
                to_name,
                replaced,
            } => {
                rename(&to.fd, &to_name, &from.fd, &from_name)?;
                match replaced {
                    Some(trashed) => rename(&self.trash_dir()?.fd, &trashed, &to.fd, &to_name),
                    None => Ok(()),
                }
            }
        }
    }

    fn trash_dir(&mut self) -> io::Result<DirRef> {
        if let Some(trash) = &self.trash {
            return Ok(trash.clone());
        }
        let path = self.backing.join(TRASH);
        match std::fs::create_dir(&path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
        let fd = open_path(&File::open(&self.backing)?, OsStr::new(TRASH))?;
        let trash = DirRef {
            key: key_of(&fd)?,
            fd: Arc::new(fd),
        };
        self.trash = Some(trash.clone());
        Ok(trash)
    }

    fn delete_trashed(&self, trashed: &OsStr) -> io::Result<()> {
        let path = self.backing.join(TRASH).join(trashed);
        if path.symlink_metadata()?.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        }
    }

    /// Removes the trash directory when no pending operation keeps anything in it.
    fn drop_trash_if_unused(&mut self) -> io::Result<()> {
        if self.trash.is_none() || self.names.iter().any(|op| op.trashed().is_some()) {
            return Ok(());
        }
        self.empty_trash()
    }

    fn empty_trash(&mut self) -> io::Result<()> {
        if self.trash.take().is_none() {
            return Ok(());
        }
        match std::fs::remove_dir_all(self.backing.join(TRASH)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Puts a file back as it was at its last `fsync`: the saved pages, then the length.
fn restore(dirty: &DirtyFile) -> io::Result<()> {
    for (&page, bytes) in &dirty.saved {
        dirty.file.write_all_at(bytes, page)?;
    }
    dirty.file.set_len(dirty.durable_len)
}

/// Up to `len` bytes of `file` from `offset`, fewer at its end.
fn read_at(file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; usize::try_from(len).map_err(io::Error::other)?];
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

/// `renameat2(…, RENAME_NOREPLACE)`: the journal's own moves never overwrite anything; if one
/// would, the invariant is broken and the error says so rather than losing a file.
pub(super) fn rename(from: &File, from_name: &OsStr, to: &File, to_name: &OsStr) -> io::Result<()> {
    rustix::fs::renameat_with(from, from_name, to, to_name, RenameFlags::NOREPLACE)
        .map_err(io::Error::from)
}

/// An `O_PATH` descriptor of `dir/name` itself (a symlink is not followed).
pub(super) fn open_path(dir: &File, name: &OsStr) -> io::Result<File> {
    use rustix::fs::OFlags;
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(File::from(rustix::fs::openat(
        dir,
        name,
        flags,
        Mode::empty(),
    )?))
}

/// The identity of the inode `fd` refers to.
pub(super) fn key_of(fd: &File) -> io::Result<Key> {
    use std::os::unix::fs::MetadataExt;
    let md = fd.metadata()?;
    Ok((md.dev(), md.ino()))
}
