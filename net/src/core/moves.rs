//! A partition moving between nodes, as the core sees it: the old owner freezes it (no take,
//! no waiting put, while the server holds every command for it), pages through it, and lets
//! it go once the move is committed; the new owner takes each page in, journaled, so its
//! replicas and a restart have the tasks as the old owner had them. What is sent where, and
//! when the move commits, is the server's (`server::shards`).

use std::collections::HashSet;

use tarq_engine::{
    id_tube, Event, MovedDedup, MovedTask, QueueError, SessionId, TaskId, TubeIx, TubeNumbers,
};

use super::parked::ParkedTake;
use super::{Core, Host};

/// One page of a partition as the old owner sends it.
#[derive(Debug, Default)]
pub struct Page {
    pub tasks: Vec<MovedTask>,
    pub dedup: Vec<MovedDedup>,
    /// Tasks that went since their copy was sent.
    pub gone: Vec<TaskId>,
    /// Tasks sent again (changed since their copy): each replaces the copy there.
    pub again: bool,
}

/// What changed in a tube a live copy follows since it began (or since last taken).
#[derive(Debug, Default)]
pub struct Changed {
    pub tube: TubeIx,
    /// Its tasks that changed, went or came.
    pub ids: HashSet<TaskId>,
    /// The tube itself changed (truncated, dropped): the copy cannot follow it.
    pub whole: bool,
}

impl Changed {
    pub(super) fn note(&mut self, ev: &Event) {
        match (ev.task(), *ev) {
            (Some(id), _) if id_tube(id) == Some(self.tube) => {
                self.ids.insert(id);
            }
            (_, Event::TubeDropped { tube } | Event::TubeTruncated { tube }) => {
                self.whole |= tube == self.tube;
            }
            _ => {}
        }
    }
}

impl<R: Copy> Core<R> {
    /// Follows `tube`'s changes from now on (a copy of it is made while it serves).
    pub fn follow(&mut self, tube: TubeIx) {
        self.queue.set_journal(true);
        self.changed = Some(Changed {
            tube,
            ..Changed::default()
        });
    }

    /// What changed since the last call (the following goes on).
    pub fn take_changed(&mut self) -> Changed {
        let tube = self.changed.as_ref().map_or(0, |c| c.tube);
        let fresh = Changed {
            tube,
            ..Changed::default()
        };
        self.changed.replace(fresh).unwrap_or_default()
    }

    /// Stops following.
    pub fn unfollow(&mut self) {
        self.changed = None;
        self.queue.set_journal(self.journal.wants_events());
    }

    /// Task `id` of `tube` as it is now (`None`: gone).
    pub fn export_task(&self, tube: TubeIx, id: TaskId) -> Option<MovedTask> {
        self.queue.export_task(tube, id)
    }

    /// Holds `tube` for a move: nothing is taken from it and no waiting put enters it until
    /// [`thaw`](Self::thaw). The commands that would change it are held by the server.
    pub fn freeze(&mut self, tube: TubeIx) {
        self.pauses.freeze(tube);
    }

    /// Ends `tube`'s hold (a move that did not commit): its takes and puts are served again.
    pub fn thaw(&mut self, tube: TubeIx, host: &mut impl Host<R>) {
        self.pauses.thaw(tube);
        if self.queue.tube_info(tube).is_some() {
            self.serve_parked(tube, host);
        }
    }

    /// Every take and watch parked on `tube`, taken out (with the other entries of their
    /// groups): a moved partition's waiters wait elsewhere now.
    pub fn take_parked_in(&mut self, tube: TubeIx) -> Vec<ParkedTake<R>> {
        let mut out = Vec::new();
        while let Some((_, p)) = self.parked.pop_oldest(tube) {
            self.parked.remove_group(p.caller.slot(), p.group);
            out.push(p);
        }
        out
    }

    /// The page of `tube` after task `after` (and dedup key `dedup_after`): up to `limit`
    /// tasks, fewer once their payloads reach `max_bytes` (one at least), and `limit` dedup
    /// keys. Empty when the copy is whole.
    pub fn export_page(
        &self,
        tube: TubeIx,
        after: Option<TaskId>,
        dedup_after: Option<u64>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, QueueError> {
        Ok(Page {
            tasks: self.queue.export_tube(tube, after, limit, max_bytes)?,
            dedup: self.queue.export_dedup(tube, dedup_after, limit)?,
            ..Page::default()
        })
    }

    /// `tube`'s numbering, for the new owner to number on from it.
    pub fn numbers(&self, tube: TubeIx) -> TubeNumbers {
        self.queue.tube_numbers(tube)
    }

    /// Takes the numbering of a moved partition in (before its tasks).
    pub fn import_numbers(&mut self, tube: TubeIx, n: TubeNumbers) -> Result<(), QueueError> {
        self.queue.import_numbers(tube, n)?;
        self.drain_events();
        Ok(())
    }

    /// Takes a page of a moved partition in: each task as it was, a Taken one held by the
    /// session `owner` maps its old holder to. Journaled. Returns how many tasks.
    pub fn import_page(
        &mut self,
        tube: TubeIx,
        page: Page,
        mut owner: impl FnMut(usize) -> SessionId,
    ) -> Result<usize, QueueError> {
        let n = page.tasks.len();
        let mut result = Ok(n);
        // Sent again (changed since their copy) or gone: the copies here go first.
        for &id in &page.gone {
            let _ = self.queue.remove_moved(tube, id);
        }
        for (i, task) in page.tasks.into_iter().enumerate() {
            let sid = if task.owner.is_some() { owner(i) } else { 0 };
            if page.again {
                let _ = self.queue.remove_moved(tube, task.id);
            }
            if let Err(e) = self.queue.import_task(tube, task, sid) {
                result = Err(e);
                break;
            }
        }
        if result.is_ok() {
            for entry in page.dedup {
                if let Err(e) = self.queue.import_dedup(tube, entry) {
                    result = Err(e);
                    break;
                }
            }
        }
        self.drain_events();
        result
    }

    /// Lets go of a partition that moved away (or of a copy whose move did not commit): it is
    /// emptied, journaled. The tube stays, empty, at its index: its numbering does too, so
    /// the partition can move back here and be numbered exactly as its owner numbers it (a
    /// tube made again at a dropped one's index would number on from the drop).
    /// Ends `tube`'s freeze, serving nothing (it is being let go of).
    pub fn thaw_only(&mut self, tube: TubeIx) {
        self.pauses.thaw(tube);
    }

    /// Removes up to `n` tasks of `tube` after task `after` (a partition that moved away, let
    /// go of a batch at a time): the last id removed, or `None` once none is left — then one
    /// truncate record tells the journal and the replicas the whole removal, which keeps the
    /// log and the clients' durable replies from waiting behind a record per task. (A
    /// restart before it finds the tasks again; the placement has them let go of again.)
    pub fn let_go_some(&mut self, tube: TubeIx, after: Option<TaskId>, n: usize) -> Option<TaskId> {
        let ids = self.queue.tube_ids(tube, after, n).unwrap_or_default();
        let Some(&last) = ids.last() else {
            let _ = self.queue.truncate(tube);
            self.drain_events();
            return None;
        };
        for id in ids {
            let _ = self.queue.forget_moved(tube, id);
        }
        Some(last)
    }

    pub fn let_go_moved(&mut self, tube: TubeIx) {
        self.pauses.thaw(tube);
        let _ = self.queue.truncate(tube);
        self.drain_events();
    }
}
