//! The console's picture of a sharded cluster: every partition's figures, asked of its owner
//! (the partitions this node leads are read here), kept for a second. The HTTP console reads
//! it at once (a page never waits on other nodes), so a tube's row is the whole tube, summed
//! over its partitions with the counts its moves carried, the same from every node, and its
//! page lists the partitions with their owning sets and counts. A second's staleness is what
//! RabbitMQ's management UI and Sidekiq's web UI show too; `queue.statistics` is the exact
//! figure.

use std::time::Duration;

use super::*;
use crate::frontend::http::{PartitionFigures, TubeTotals};

/// The connection index the console's own gathers answer to: no connection has it.
pub(super) const CONSOLE_CLIENT: usize = usize::MAX;

/// How old the figures may be before a page's read asks for new ones.
const FRESH: Duration = Duration::from_secs(1);

/// A gather whose answers were lost (a link failed before it answered) is asked again after
/// this long.
const GIVE_UP: Duration = Duration::from_secs(5);

/// The console's figures and the gather that renews them.
#[derive(Default)]
pub(super) struct Console {
    figures: Option<(Instant, Arc<HashMap<String, TubeTotals>>)>,
    /// The gather in flight: its key, when it began.
    asking: Option<(u64, Instant)>,
    /// The engine session the console's asks run as on the owners.
    sid: Option<SessionId>,
}

impl Shards {
    /// The engine session the console's asks run as on the owners, once made.
    pub(super) fn console_sid(&self) -> Option<SessionId> {
        self.console.sid
    }

    pub(super) fn set_console_sid(&mut self, sid: SessionId) {
        self.console.sid = Some(sid);
    }
}

impl Server {
    /// The console's figures of every placed tube (`None` on a single node), asking for new
    /// ones when they are more than a second old; the first read of a page gets `None` until
    /// the owners have answered.
    pub(crate) fn cluster_tubes(&mut self) -> Option<Arc<HashMap<String, TubeTotals>>> {
        let now = Instant::now();
        let shards = self.shards.as_ref()?;
        let c = &shards.console;
        let stale = c.figures.as_ref().is_none_or(|(at, _)| now - *at > FRESH);
        let asking = c.asking.is_some_and(|(_, at)| now - at < GIVE_UP);
        let figures = c.figures.as_ref().map(|(_, f)| Arc::clone(f));
        if stale && !asking {
            self.ask_console_figures();
        }
        // Answered at once when every partition is led here.
        let shards = self.shards.as_ref()?;
        shards
            .console
            .figures
            .as_ref()
            .map(|(_, f)| Arc::clone(f))
            .or(figures)
    }

    /// Asks every partition's figures: the ones led here read now, the others of their owners.
    fn ask_console_figures(&mut self) {
        let sid = match self.shards.as_ref().and_then(|s| s.console.sid) {
            Some(sid) => sid,
            None => self.new_session(),
        };
        let leads = self.leads();
        let holders = self.core.queue().holders();
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        shards.console.sid = Some(sid);
        let key = shards.next_gather;
        shards.next_gather += 1;
        let mut per = Vec::new();
        let mut asks = Vec::new();
        for t in shards.tubes.values() {
            for &ix in &t.parts {
                let mut s = Stats::default();
                if shards.here(ix, leads) {
                    s = self.core.tube_figures(ix, &holders).unwrap_or_default();
                } else if let Some(p) = shards.part(ix) {
                    asks.push((p.set, ix));
                }
                per.push((t.name.clone(), ix, s));
            }
        }
        let client = Client {
            idx: CONSOLE_CLIENT,
            gen: 0,
            sid,
            reply: ReplyTo::Router(key),
        };
        let gather = Gather::every_tube(client, asks.len(), per);
        if asks.is_empty() {
            return self.console_gathered(gather.per);
        }
        shards.console.asking = Some((key, Instant::now()));
        shards.gathers.insert(key, gather);
        for (set, ix) in asks {
            let cmd = Command::TubeStats { tube: ix };
            self.forward(set, client, cmd, Then::GatherTube { key, head: ix });
        }
    }

    /// An answer meant for the console's gather that did not come from an owner (a forward
    /// refused before it was sent): counted as that partition's, with no figures.
    pub(super) fn console_refused(&mut self, c: Client) {
        if let ReplyTo::Router(key) = c.reply {
            self.gathered(key, None, Digest::Nothing);
        }
    }

    /// The console's gather is answered: every partition's figures, `per` (tube, index,
    /// figures), become the tubes' sums and partition lists.
    pub(super) fn console_gathered(&mut self, per: Vec<(String, TubeIx, Stats)>) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let mut tubes: HashMap<String, TubeTotals> = HashMap::new();
        for t in shards.placement.tubes.values() {
            let Some(head) = t.partitions.first().map(|p| p.index) else {
                continue;
            };
            let mut stats = shards.carried(head);
            let partitions = (t.partitions.iter().enumerate())
                .map(|(p, part)| {
                    let s = per
                        .iter()
                        .find(|(n, ix, _)| *n == t.name && *ix == part.index)
                        .map(|(_, _, s)| *s);
                    if let Some(s) = &s {
                        stats += s;
                    }
                    let primary = (shards.sets.iter())
                        .find(|x| x.name == part.set)
                        .and_then(|x| x.primary.clone());
                    PartitionFigures {
                        partition: p as u16,
                        index: part.index,
                        set: part.set.clone(),
                        primary,
                        stats: s,
                    }
                })
                .collect();
            tubes.insert(t.name.clone(), TubeTotals { stats, partitions });
        }
        shards.console.asking = None;
        shards.console.figures = Some((Instant::now(), Arc::new(tubes)));
    }
}
