//! The sync thread: fsyncs WAL segments off the loop thread so the loop keeps serving while the
//! disk syncs (`--wal-mode fsync`). The loop writes a batch, then raises the target; the thread
//! syncs every file that may hold unsynced bytes, publishes how far it got and wakes the loop
//! through the server's `Wake` callback. Batches written while a sync runs ride on the next one: that is
//! the group commit. A failure is published with the generation it belongs to, so a result for
//! a segment the loop has since abandoned is ignored.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::storage::{Storage, StorageFile};
use super::{BatchId, Notify};

#[derive(Default)]
struct State {
    /// The segment being written, synced in every round.
    current: Option<Arc<dyn StorageFile>>,
    /// Segments rotated away that may still hold unsynced bytes.
    retired: Vec<Arc<dyn StorageFile>>,
    /// A segment was created: its directory entry must be synced too.
    dir_dirty: bool,
    /// The last batch written, to be made durable.
    target: BatchId,
    /// Bumped by the loop when it abandons a segment after a failure.
    generation: u64,
    /// The last batch made durable in `done_generation`.
    done: BatchId,
    done_generation: u64,
    /// A failed sync: (generation, error text).
    error: Option<(u64, std::io::Error)>,
    syncs: u64,
    stop: bool,
}

pub(super) struct Shared {
    state: Mutex<State>,
    /// Signals the thread (new target, stop) and waiters on `wait_done`.
    cv: Condvar,
}

pub(super) struct SyncThread {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

/// What the loop learns from the thread.
pub(super) struct Progress {
    pub done: BatchId,
    pub error: Option<std::io::Error>,
    pub syncs: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SyncThread {
    /// Starts the thread, off core `loop_cpu` when there is another (see `tarq_affinity`).
    pub fn start(
        storage: Arc<dyn Storage>,
        notify: Notify,
        loop_cpu: Option<usize>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        let handle = tarq_affinity::spawn_off_core("tarq-wal-sync", loop_cpu, move || {
            run(&s, &*storage, &notify)
        })?;
        Ok(Self {
            shared,
            handle: Some(handle),
        })
    }

    /// A new segment is being written from now on; the previous one is synced once more.
    pub fn set_segment(&self, file: Arc<dyn StorageFile>) {
        let mut g = self.shared.lock();
        if let Some(old) = g.current.replace(file) {
            g.retired.push(old);
        }
        g.dir_dirty = true;
    }

    /// Batches up to `target` are written: make them durable.
    pub fn request(&self, target: BatchId) {
        let mut g = self.shared.lock();
        g.target = g.target.max(target);
        self.shared.cv.notify_all();
    }

    /// Forgets the current segment (it failed): later results for it are ignored, and batches
    /// after `durable` count only once rewritten to a new segment and synced there.
    pub fn abandon(&self, durable: BatchId) {
        let mut g = self.shared.lock();
        g.generation += 1;
        g.current = None;
        g.retired.clear();
        g.error = None;
        g.target = durable;
        g.done = durable;
        g.done_generation = g.generation;
    }

    pub fn progress(&self) -> Progress {
        let mut g = self.shared.lock();
        let gen = g.generation;
        let error = match g.error.take() {
            Some((eg, e)) if eg == gen => Some(e),
            _ => None,
        };
        let done = if g.done_generation == gen { g.done } else { 0 };
        Progress {
            done,
            error,
            syncs: g.syncs,
        }
    }

    /// Blocks until batch `upto` is durable, a sync fails, or `timeout` passes.
    pub fn wait_done(&self, upto: BatchId, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.lock();
        loop {
            if (g.done >= upto && g.done_generation == g.generation) || g.error.is_some() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self
                .shared
                .cv
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(shared: &Shared, storage: &dyn Storage, notify: &Notify) {
    let mut g = shared.lock();
    loop {
        while !g.stop && (g.target <= g.done || g.current.is_none()) {
            g = shared.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.stop {
            return;
        }
        let target = g.target;
        let generation = g.generation;
        let current = g.current.clone();
        let retired = std::mem::take(&mut g.retired);
        let dir = std::mem::take(&mut g.dir_dirty);
        drop(g);

        let mut result = Ok(());
        for f in retired.iter().chain(current.iter()) {
            result = result.and_then(|()| f.sync());
        }
        if dir {
            result = result.and_then(|()| storage.sync_dir());
        }

        g = shared.lock();
        g.syncs += 1;
        if g.generation == generation {
            match result {
                Ok(()) => {
                    g.done = target;
                    g.done_generation = generation;
                }
                Err(e) => {
                    tracing::error!(error = %e, "WAL sync failed");
                    g.error = Some((generation, e));
                    // Nothing more to do for this generation until the loop abandons it.
                    g.current = None;
                }
            }
        }
        shared.cv.notify_all();
        notify.wake();
    }
}
