//! A whole tube's tasks of one status, listed from any node of a sharded cluster (the
//! console's task list): the partitions this node leads are read here, the others asked of
//! their owners over the links (`Command::ListTasks`), and the answers put together in one
//! order — partition by partition, each in the order its owner keeps them. A page's cursor
//! is the id of its last task, which names its partition, so the next page goes on in that
//! partition after it and then in the partitions after it: every task is listed once, in a
//! stable order, however the pages fall.
//!
//! A listing never holds the loop: the answer goes when every owner has answered, or after
//! [`LIST_WAIT`] with the partitions that did not (their tasks are missing from the page,
//! which says so).

use super::ctx::Ctx;
use super::*;
use crate::core::{Listed, TaskPage};
use tarq_engine::{Status, TaskId};

/// How long a listing waits for the owners before it answers with what it has: a console's
/// page waits no longer for an owner that is slow or gone (a link's failure answers sooner).
pub(super) const LIST_WAIT: Micros = 2_000_000;

/// One partition of a listing: where it is and what its owner answered (`None`: not yet).
pub(super) struct Asked {
    pub(super) partition: u16,
    pub(super) index: TubeIx,
    pub(super) set: String,
    pub(super) got: Option<Result<Vec<Listed>, String>>,
}

/// A listing waiting for its owners.
pub(super) struct Listing {
    client: Client,
    tube: String,
    status: Status,
    limit: usize,
    parts: Vec<Asked>,
    /// When it answers with what it has (monotonic µs).
    pub(super) deadline: Micros,
}

/// The page of tube `tube`'s `parts` (in partition order) at most `limit` tasks long: the
/// tasks, the cursor of the next page when there are more, and the partitions not listed.
pub(super) fn page(tube: String, status: Status, parts: Vec<Asked>, limit: usize) -> TaskPage {
    let mut tasks = Vec::new();
    let mut unanswered = Vec::new();
    let mut more = false;
    for a in parts {
        match a.got {
            Some(Ok(listed)) => {
                for t in listed {
                    if tasks.len() == limit {
                        more = true;
                        break;
                    }
                    tasks.push((a.partition, a.index, t));
                }
            }
            Some(Err(why)) => unanswered.push((a.partition, a.set, why)),
            None => {
                let why = format!("no answer within {} s", LIST_WAIT / 1_000_000);
                unanswered.push((a.partition, a.set, why));
            }
        }
    }
    let next_after = more.then(|| tasks.last().map(|(_, _, t)| t.id)).flatten();
    TaskPage {
        tube,
        status,
        tasks,
        next_after,
        unanswered,
    }
}

impl Router {
    /// Lists tube `head`'s tasks in `status` after task `after`, at most `limit`, for
    /// `client`, from every partition from the cursor's on (see the module's notes); a tube
    /// the placement lacks is this node's alone and read here.
    pub(super) fn list_across(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        head: TubeIx,
        status: Status,
        after: Option<TaskId>,
        limit: usize,
    ) {
        let leads = cx.leads();
        if let Some(why) = self.over_bound(self.listings.len(), "task listings waiting") {
            return self.answer(cx, client, &Outcome::Error(Refusal::Shards(why)));
        }
        let q = cx.core.queue();
        let (name, parts) = match self.tubes.get(&head) {
            Some(t) => (t.name.clone(), t.parts.clone()),
            None => {
                let name = q.tube_info(head).map(|i| i.name.to_owned());
                (name.unwrap_or_default(), vec![head])
            }
        };
        // The cursor's partition, and from it on; an id of none of them starts at the first.
        let from = after
            .and_then(id_tube)
            .and_then(|ix| parts.iter().position(|&p| p == ix))
            .unwrap_or(0);
        let (asked, remote) =
            self.list_here(q, &parts[from..], from, (status, after, limit), leads);
        let key = self.next_gather;
        self.next_gather += 1;
        let listing = Listing {
            client,
            tube: name,
            status,
            limit,
            parts: asked,
            deadline: cx.mono + LIST_WAIT,
        };
        self.listings.insert(key, listing);
        for (at, set, ix, after) in remote {
            let cmd = Command::ListTasks {
                tube: ix,
                status,
                after,
                limit: limit as u32 + 1,
            };
            self.forward(cx, set, client, cmd, Then::List { key, at });
        }
        self.listing_done(cx, key, false);
    }

    /// The owner of the `at`th partition of listing `key` answered.
    pub(super) fn listed(&mut self, cx: &mut Ctx<'_>, key: u64, at: usize, outcome: Outcome<'_>) {
        let Some(l) = self.listings.get_mut(&key) else {
            return;
        };
        let Some(a) = l.parts.get_mut(at) else {
            return;
        };
        a.got = Some(match outcome {
            Outcome::Tasks(tasks) => Ok(tasks),
            Outcome::Error(e) => Err(e.to_string()),
            other => Err(format!("an answer that is no listing: {other:?}")),
        });
        self.listing_done(cx, key, false);
    }

    /// Answers listing `key` when every partition has answered, or, with `now_or_never`, with
    /// what it has.
    fn listing_done(&mut self, cx: &mut Ctx<'_>, key: u64, now_or_never: bool) {
        let done = (self.listings.get(&key))
            .is_some_and(|l| now_or_never || l.parts.iter().all(|a| a.got.is_some()));
        if !done {
            return;
        }
        let l = self.listings.remove(&key).expect("present above");
        let page = page(l.tube, l.status, l.parts, l.limit);
        self.answer(cx, l.client, &Outcome::TaskPage(Box::new(page)));
    }

    /// Answers the listings whose owners did not all answer within [`LIST_WAIT`].
    pub(super) fn expire_listings(&mut self, cx: &mut Ctx<'_>) {
        let now = cx.mono;
        let due: Vec<u64> = (self.listings.iter())
            .filter(|(_, l)| l.deadline <= now)
            .map(|(&k, _)| k)
            .collect();
        for key in due {
            self.listing_done(cx, key, true);
        }
    }
}

/// A remote partition's ask: its place among the asked, its set, its index, the cursor.
type RemoteAsk = (usize, usize, TubeIx, Option<TaskId>);

impl Router {
    /// The partitions of a listing from the cursor's on (`parts`, the first of them partition
    /// `from`): those this node holds are read now, the others are left to ask their owners.
    fn list_here(
        &self,
        q: &tarq_engine::Queue,
        parts: &[TubeIx],
        from: usize,
        (status, after, limit): (Status, Option<TaskId>, usize),
        leads: bool,
    ) -> (Vec<Asked>, Vec<RemoteAsk>) {
        let mut asked = Vec::new();
        let mut remote = Vec::new();
        for (i, &ix) in parts.iter().enumerate() {
            let after = after.filter(|_| i == 0);
            let set = self.part(ix).map(|pt| pt.set);
            let set_name = set.map_or_else(|| self.set.clone(), |s| self.sets[s].name.clone());
            let got = match set {
                Some(set) if !self.here(ix, leads) => {
                    remote.push((asked.len(), set, ix, after));
                    None
                }
                _ => Some(
                    (q.list(ix, status, after, limit + 1))
                        .map(|v| v.iter().map(Listed::of).collect())
                        .map_err(|e| e.to_string()),
                ),
            };
            asked.push(Asked {
                partition: (from + i) as u16,
                index: ix,
                set: set_name,
                got,
            });
        }
        (asked, remote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: TaskId) -> Listed {
        Listed {
            id,
            status: Status::Ready,
            runat: 0,
            pri: 0,
            ttl: None,
            ttr: None,
            created: 0,
            deliveries: 0,
            utube: None,
            data: vec![0xa1, b'x'],
            size: 1,
            cut: false,
        }
    }

    fn asked(partition: u16, got: Option<Result<Vec<TaskId>, &str>>) -> Asked {
        Asked {
            partition,
            index: 10 + partition,
            set: format!("s{partition}"),
            got: got.map(|r| {
                r.map(|ids| ids.into_iter().map(task).collect())
                    .map_err(str::to_owned)
            }),
        }
    }

    fn ids(tasks: &[(u16, TubeIx, Listed)]) -> Vec<(u16, TaskId)> {
        tasks.iter().map(|(p, _, t)| (*p, t.id)).collect()
    }

    #[test]
    fn a_page_is_the_partitions_in_order_cut_at_the_limit_with_its_cursor() {
        let parts = || {
            vec![
                asked(0, Some(Ok(vec![1, 2]))),
                asked(1, Some(Ok(vec![7, 8, 9]))),
            ]
        };
        let p = page("jobs".into(), Status::Ready, parts(), 3);
        assert_eq!(ids(&p.tasks), [(0, 1), (0, 2), (1, 7)]);
        assert_eq!(p.next_after, Some(7));
        assert!(p.unanswered.is_empty());
        // Exactly as many as the limit: no next page.
        let p = page("jobs".into(), Status::Ready, parts(), 5);
        assert_eq!(p.tasks.len(), 5);
        assert_eq!(p.next_after, None);
    }

    #[test]
    fn partitions_that_did_not_answer_are_named_and_the_others_listed() {
        let parts = vec![
            asked(0, Some(Ok(vec![1]))),
            asked(1, Some(Err("no primary now"))),
            asked(2, None),
            asked(3, Some(Ok(vec![40]))),
        ];
        let p = page("jobs".into(), Status::Ready, parts, 10);
        assert_eq!(ids(&p.tasks), [(0, 1), (3, 40)]);
        assert_eq!(p.next_after, None);
        assert_eq!(
            p.unanswered,
            [
                (1, "s1".to_owned(), "no primary now".to_owned()),
                (2, "s2".to_owned(), "no answer within 2 s".to_owned())
            ]
        );
    }
}
