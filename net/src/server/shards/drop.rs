//! Dropping a partitioned tube. Every partition is asked first whether it may go
//! (`Command::DropCheck`: no task taken, no take waiting) and for the next number it would
//! give. Then the tube leaves the placement in etcd: that transaction is the commit point,
//! and it records each index's floor, so a tube placed there later never gives an id twice.
//! Every node lets go of what it held of the tube when its map no longer has it. Between the
//! checks and the commit a take can still land; what it took goes with the tube, as a
//! truncate's tasks do.

use super::*;

impl Server {
    /// `drop` of placed tube `head` for `client`.
    pub(super) fn drop_placed(&mut self, client: Client, head: TubeIx, leads: bool) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(parts) = shards.tubes.get(&head).map(|t| t.parts.clone()) else {
            return;
        };
        let key = shards.next_gather;
        shards.next_gather += 1;
        let mut asks = Vec::new();
        let mut floors = Vec::new();
        for &ix in &parts {
            let (here, part) = match self.shards.as_ref() {
                Some(s) => (s.here(ix, leads), s.part(ix)),
                None => return,
            };
            if here {
                let (core, wire) = self.split();
                match core.may_drop(ix, &wire) {
                    Ok(next) => floors.push((ix, next)),
                    Err(e) => return self.answer(client, &Outcome::Error(e)),
                }
            } else if let Some(p) = part {
                asks.push((p.set, ix));
            }
        }
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        shards.gathers.insert(
            key,
            Gather {
                client,
                left: asks.len(),
                stats: Stats::default(),
                count: 0,
                kind: GatherKind::Drop { head },
                error: None,
                per: Vec::new(),
                floors,
                answered: Vec::new(),
            },
        );
        if asks.is_empty() {
            return self.drop_checked(key);
        }
        for (set, ix) in asks {
            let cmd = Command::DropCheck { tube: ix };
            self.forward(set, client, cmd, Then::GatherTube { key, head: ix });
        }
    }

    /// Every partition may go: the tube leaves the placement, with each index's floor.
    pub(super) fn drop_checked(&mut self, key: u64) {
        let Some(shards) = self.shards.as_mut() else {
            return;
        };
        let Some(g) = shards.gathers.remove(&key) else {
            return;
        };
        let GatherKind::Drop { head } = g.kind else {
            return;
        };
        if let Some(e) = g.error {
            return self.answer(g.client, &Outcome::Error(e));
        }
        let Some(t) = shards.tubes.get(&head) else {
            let e = tarq_engine::QueueError::TubeNotFound(head);
            return self.answer(g.client, &Outcome::Error(e.into()));
        };
        // The placement names floors by partition number.
        let floors = (g.floors.iter())
            .filter_map(|&(ix, next)| Some((t.parts.iter().position(|&p| p == ix)? as u16, next)))
            .collect();
        let (name, parts) = (t.name.clone(), t.parts.clone());
        let token = shards.next_token;
        shards.next_token += 1;
        shards.drops.insert(token, (g.client, parts));
        if let Some(c) = &self.cluster {
            c.handle().drop_tube(token, &name, floors);
        }
    }

    /// A drop this node asked etcd for was made (or refused).
    pub(super) fn drop_done(
        &mut self,
        client: Client,
        parts: Vec<TubeIx>,
        result: Result<tarq_cluster::TubePlacement, tarq_cluster::PlacementError>,
    ) {
        match result {
            Ok(_) => {
                if let Some(s) = self.shards.as_mut() {
                    for ix in &parts {
                        if let Some(p) = s.parts.get_mut(*ix as usize) {
                            *p = None;
                        }
                    }
                    s.tubes.remove(&parts[0]);
                }
                self.let_go(&parts);
                self.answer(client, &Outcome::Dropped);
            }
            Err(e) => self.answer(client, &Outcome::Error(Refusal::Shards(e.to_string()))),
        }
    }

    /// Lets go of the partitions at `indexes`, no longer placed: waiting takes on their tube
    /// are answered with no task, and a primary drops what it held of them.
    pub(super) fn let_go(&mut self, indexes: &[TubeIx]) {
        if indexes.is_empty() {
            return;
        }
        let waiting: Vec<u64> = (self.shards.as_ref())
            .map(|s| {
                (s.waiters.iter())
                    .filter(|(_, w)| w.heads.iter().any(|h| indexes.contains(h)))
                    .map(|(&id, _)| id)
                    .collect()
            })
            .unwrap_or_default();
        for id in waiting {
            if let Some(w) = self
                .shards
                .as_ref()
                .and_then(|s| s.waiters.get(&id))
                .map(|w| w.client)
            {
                self.end_wait(id);
                self.answer(w, &Outcome::Nothing);
            }
        }
        if let Some(s) = self.shards.as_mut() {
            s.watching.retain(|ix, _| !indexes.contains(ix));
        }
        if !self.leads() {
            return;
        }
        for &ix in indexes {
            let (core, mut wire) = self.split();
            core.drop_placed(ix, &mut wire);
        }
        self.take_routed();
    }
}
