//! A FUSE filesystem that forgets what was not fsynced, on command: the model of lazyfs, the
//! filesystem Jepsen puts under a database to simulate a power loss. A node's data directory is
//! a [`LazyFs`] mount over a backing directory; the nemesis kills every process of the node,
//! calls [`LazyFs::lose_unsynced`], and restarts the node on the same mountpoint, which then
//! holds exactly what had been made durable.
//!
//! The design is the simplest one that stays exact: every operation passes through to the
//! backing directory at once (so reads, listings and sizes are simply the backing directory's),
//! and a journal keeps beside it what a power loss would take back: for each file changed since
//! its last `fsync`, its length then and the old bytes of the pages changed since (an undo log,
//! not a second page cache); for each namespace operation not yet durable, how to undo it, with
//! unlinked and replaced inodes kept in a hidden trash until their removal is durable.
//!
//! The durability model, which is lazyfs's and the strict reading of POSIX:
//! - `fsync` or `fdatasync` of a file makes its data and its length durable (`sync_file_range`
//!   never reaches FUSE, and so makes nothing durable; `O_SYNC`/`O_DSYNC` writes are durable at
//!   once). It does **not** make the file's name durable.
//! - A name made, removed or renamed in a directory (create, mkdir, symlink, unlink, rmdir,
//!   rename) is durable once that directory is fsynced. So a file created and fsynced, whose
//!   directory was not, is gone after the loss, data and all; a new directory whose parent was
//!   not fsynced is gone with everything in it. A rename between two directories is one
//!   operation (as in ext4's journal): an `fsync` of either makes it durable.
//! - A file whose name is durable but whose data is not comes back with its last fsynced data,
//!   cut to its last fsynced length (empty, if it was never fsynced).
//! - Modes, owners and times pass through and are never taken back; hard links are refused.
//!
//! The power loss: kill -9 every process using the mount and reap them, then call
//! [`LazyFs::lose_unsynced`] (it waits a little for the kernel to close their files, and fails
//! if some stay open), then start the node again on the same mountpoint: the mount stays, and
//! the kernel's caches of it are dropped. [`LazyFs::unmount`] (or drop) is a clean shutdown:
//! everything written is kept, as after `sync`; lose first to shut down by power loss.
//!
//! Mount before starting the node. Where `/` is a private mount (as on the test machines), a
//! process in a mount namespace made before the mount does not see it (`ip netns exec` makes
//! one per command), and one made after holds a copy of it: unmounting in the first namespace
//! leaves the copy served until the last process in that namespace is gone.
//!
//! Built on `fuser` without libfuse: as root the mount is a `mount(2)` call; otherwise, and to
//! unmount when not root, fuser and this module run `fusermount3` (Debian's `fuse3`).

mod journal;
mod ops;
mod state;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use fuser::{BackgroundSession, Config, INodeNo, MountOption, Notifier, SessionACL};

pub use journal::Lost;
use state::State;

/// How long [`LazyFs::lose_unsynced`] waits for the kernel to close the files of killed
/// processes (it takes milliseconds).
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// How long [`LazyFs::unmount`] waits for the filesystem's thread to end after an unmount that
/// was not lazy (it takes milliseconds, unless another mount namespace holds a copy).
const END_PATIENCE: Duration = Duration::from_secs(2);

/// A mounted lazy filesystem. Unmounted when dropped.
pub struct LazyFs {
    backing: PathBuf,
    mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
    notifier: Notifier,
}

impl LazyFs {
    /// Mounts at `mountpoint` (an existing directory) a filesystem that passes through to
    /// `backing_dir`, whose present content is taken as durable. Neither may be inside the
    /// other. Returns once the mount is ready; a thread of its own serves it.
    pub fn mount(backing_dir: &Path, mountpoint: &Path) -> anyhow::Result<LazyFs> {
        let backing = canonical(backing_dir)?;
        let mountpoint = canonical(mountpoint)?;
        if backing.starts_with(&mountpoint) || mountpoint.starts_with(&backing) {
            // The filesystem would go through itself to reach its backing files, and wait on
            // its own (single) thread forever.
            bail!(
                "lazyfs: {} and {} are inside one another",
                backing.display(),
                mountpoint.display()
            );
        }
        let state = State::new(&backing)
            .with_context(|| format!("lazyfs: opening {}", backing.display()))?;
        let state = Arc::new(Mutex::new(state));
        let ops = ops::Ops {
            state: state.clone(),
        };
        let session = fuser::spawn_mount(ops, &mountpoint, &config()).with_context(|| {
            format!(
                "lazyfs: mounting {} (needs /dev/fuse, and when not root fusermount3 \
                 from Debian's fuse3)",
                mountpoint.display()
            )
        })?;
        Ok(LazyFs {
            backing,
            mountpoint,
            state,
            notifier: session.notifier(),
            session: Some(session),
        })
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn backing_dir(&self) -> &Path {
        &self.backing
    }

    /// The power loss: takes back everything not made durable (see the module's doc), so the
    /// backing directory holds exactly what had been. Every process using the mount must have
    /// been killed first; this waits up to [`CLOSE_PATIENCE`] for the kernel to close their files,
    /// then fails naming how many are still open. The mount stays usable.
    pub fn lose_unsynced(&self) -> anyhow::Result<Lost> {
        let deadline = Instant::now() + CLOSE_PATIENCE;
        let lost = loop {
            let mut state = self.state();
            let open = state.open_files();
            if open == 0 {
                break state
                    .lose()
                    .context("lazyfs: taking back unsynced changes")?;
            }
            drop(state);
            if Instant::now() >= deadline {
                bail!(
                    "lazyfs: {open} files are still open on {}; kill every process using it first",
                    self.mountpoint.display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.forget_caches();
        Ok(lost)
    }

    /// A clean shutdown: unmounts (lazily if the mount is busy) and keeps everything written.
    pub fn unmount(mut self) -> anyhow::Result<()> {
        self.unmount_now()
    }

    fn unmount_now(&mut self) -> anyhow::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let lazily = detach(&self.mountpoint)
            .with_context(|| format!("lazyfs: unmounting {}", self.mountpoint.display()))?;
        let patience = if lazily { Duration::ZERO } else { END_PATIENCE };
        let deadline = Instant::now() + patience;
        while !session.guard.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if session.guard.is_finished() {
            ended_by_unmount(session.join()).context("lazyfs: the filesystem's thread")?;
        } else {
            // Still in use: detached lazily with files open, or held by a copy of the mount in
            // another mount namespace. The thread serves them until the last goes, then ends
            // by itself.
            drop(session);
        }
        self.state()
            .keep_all()
            .context("lazyfs: emptying the trash")
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops what the kernel cached of every inode it knows: their data and attributes changed
    /// behind its back. Errors are for inodes the kernel has forgotten meanwhile.
    fn forget_caches(&self) {
        let inodes = self.state().inodes();
        for ino in inodes {
            let _ = self.notifier.inval_inode(INodeNo(ino), 0, 0);
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Err(e) = self.unmount_now() {
            eprintln!("{e:#}");
        }
    }
}

fn config() -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("lazyfs".into()),
        MountOption::Subtype("lazyfs".into()),
        // The kernel checks permissions against the attributes, as for a local filesystem.
        MountOption::DefaultPermissions,
    ];
    // The node under test may run as any user; only root may let others in without
    // `user_allow_other` in /etc/fuse.conf.
    config.acl = if rustix::process::geteuid().is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config
}

fn canonical(path: &Path) -> anyhow::Result<PathBuf> {
    path.canonicalize()
        .with_context(|| format!("lazyfs: {}", path.display()))
}

/// Unmounts `mountpoint`: at once when nothing uses it, lazily when something does; through
/// `fusermount3` when not allowed to `umount` (not root). Says whether it was lazily.
/// Detaches every lazyfs mount at or under `dir` that an interrupted run left (its serving
/// process gone, the mount answers nothing): what `tarq-chaos clean` and a new run do first.
/// Returns the mountpoints detached.
pub fn unmount_stale(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let Ok(dir) = dir.canonicalize() else {
        return Ok(Vec::new());
    };
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let mut found: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (source, target) = (f.next()?, f.next()?);
            // /proc/mounts escapes spaces as \040.
            let target = PathBuf::from(target.replace("\\040", " "));
            (source == "lazyfs" && target.starts_with(&dir)).then_some(target)
        })
        .collect();
    // Deepest first, so an outer mount is not busy with an inner one.
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for m in &found {
        rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH)
            .or_else(|_| fusermount_unmount(m))?;
    }
    Ok(found)
}

fn detach(mountpoint: &Path) -> io::Result<bool> {
    use rustix::io::Errno;
    use rustix::mount::{unmount, UnmountFlags};
    match unmount(mountpoint, UnmountFlags::empty()) {
        Ok(()) => Ok(false),
        Err(Errno::BUSY) => Ok(unmount(mountpoint, UnmountFlags::DETACH).map(|()| true)?),
        Err(Errno::PERM) => fusermount_unmount(mountpoint).map(|()| true),
        // Someone unmounted it already.
        Err(Errno::INVAL) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// How the filesystem's thread ended, once this module unmounted it. The kernel ends the
/// connection at the unmount, and the thread's next read of `/dev/fuse` says so: mostly with
/// `ENODEV`, which fuser takes for the end, but at times with `ECONNABORTED` (seen once in a CI
/// run, on Linux 6.18, a test that had only written and unmounted; the mainline kernel says so
/// only to a daemon that asked for `FUSE_ABORT_ERROR`, which fuser does not, so this is what was
/// seen, not explained), which fuser passes on as the thread's error. Called only once this
/// module's unmount has returned, both are the end of the filesystem; anything else is an
/// error.
fn ended_by_unmount(thread: io::Result<()>) -> io::Result<()> {
    match thread {
        Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {
            // Said, so a run where this comes back is seen to.
            eprintln!("lazyfs: the filesystem's thread ended with {e} after the unmount");
            Ok(())
        }
        other => other,
    }
}

fn fusermount_unmount(mountpoint: &Path) -> io::Result<()> {
    let out = Command::new("fusermount3")
        .args(["-u", "-z", "--"])
        .arg(mountpoint)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "fusermount3 -u -z: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_cut_off_by_the_unmount_is_the_end_and_other_errors_stay_errors() {
        assert!(ended_by_unmount(Ok(())).is_ok());
        let aborted = io::Error::from_raw_os_error(rustix::io::Errno::CONNABORTED.raw_os_error());
        assert!(ended_by_unmount(Err(aborted)).is_ok());
        let eio = rustix::io::Errno::IO.raw_os_error();
        let other = io::Error::from_raw_os_error(eio);
        assert_eq!(
            ended_by_unmount(Err(other)).unwrap_err().raw_os_error(),
            Some(eio)
        );
    }
}
