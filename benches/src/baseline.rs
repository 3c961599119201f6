//! The baseline for the engine benches: the same queue operations (put, take, ack, release,
//! TTL expiry in bounded steps) over a slab arena with `BTreeMap<(pri, id), slot>` per status
//! and a `BTreeMap<(at, id), slot>` of expiries — what one would write without hand-made
//! structures. It keeps no session lists and no journal, so it is, if anything, favoured.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use slab::Slab;

/// The same one-multiply hash the engine uses, so the comparison is about the lists.
#[derive(Default)]
pub struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0 ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        let p = u128::from(n) * 0x9E37_79B9_7F4A_7C15;
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

struct BTask {
    pri: i64,
    expire_at: Option<u64>,
    owner: Option<u64>,
    #[allow(dead_code)] // held like the engine holds it
    data: Box<[u8]>,
}

/// A queue with the engine's semantics for the benched operations, built on `BTreeMap`s.
#[derive(Default)]
pub struct Baseline {
    slots: Slab<BTask>,
    index: HashMap<u64, u32, BuildHasherDefault<FoldHasher>>,
    ready: BTreeMap<(i64, u64), u32>,
    taken: BTreeMap<(i64, u64), u32>,
    expiries: BTreeMap<(u64, u64), u32>,
    last_id: u64,
}

impl Baseline {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn put(&mut self, now: u64, data: Box<[u8]>, pri: i64, ttl: Option<u64>) -> u64 {
        self.last_id += 1;
        let id = self.last_id;
        let expire_at = ttl.map(|t| now + t);
        let k = self.slots.insert(BTask {
            pri,
            expire_at,
            owner: None,
            data,
        }) as u32;
        self.index.insert(id, k);
        self.ready.insert((pri, id), k);
        if let Some(at) = expire_at {
            self.expiries.insert((at, id), k);
        }
        id
    }

    pub fn take(&mut self, sid: u64) -> Option<u64> {
        let ((pri, id), k) = self.ready.pop_first()?;
        self.slots[k as usize].owner = Some(sid);
        self.taken.insert((pri, id), k);
        Some(id)
    }

    fn owned(&self, sid: u64, id: u64) -> Option<u32> {
        let &k = self.index.get(&id)?;
        (self.slots[k as usize].owner == Some(sid)).then_some(k)
    }

    pub fn ack(&mut self, sid: u64, id: u64) -> bool {
        let Some(k) = self.owned(sid, id) else {
            return false;
        };
        let t = self.slots.remove(k as usize);
        self.index.remove(&id);
        self.taken.remove(&(t.pri, id));
        if let Some(at) = t.expire_at {
            self.expiries.remove(&(at, id));
        }
        true
    }

    pub fn release(&mut self, sid: u64, id: u64) -> bool {
        let Some(k) = self.owned(sid, id) else {
            return false;
        };
        let t = &mut self.slots[k as usize];
        t.owner = None;
        let key = (t.pri, id);
        self.taken.remove(&key);
        self.ready.insert(key, k);
        true
    }

    /// Bench setup: marks a ready task taken by `sid` (the engine's `restore_status`).
    pub fn force_taken(&mut self, id: u64, sid: u64) {
        let k = self.index[&id];
        let t = &mut self.slots[k as usize];
        t.owner = Some(sid);
        let key = (t.pri, id);
        self.ready.remove(&key);
        self.taken.insert(key, k);
    }

    /// Deletes up to `budget` tasks whose TTL passed, in (time, id) order.
    pub fn advance(&mut self, now: u64, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            match self.expiries.first_key_value() {
                Some((&(at, _), _)) if at <= now => {}
                _ => break,
            }
            let ((_, id), k) = self.expiries.pop_first().expect("peeked");
            let t = self.slots.remove(k as usize);
            self.index.remove(&id);
            let key = (t.pri, id);
            if t.owner.is_some() {
                self.taken.remove(&key);
            } else {
                self.ready.remove(&key);
            }
            n += 1;
        }
        n
    }
}
