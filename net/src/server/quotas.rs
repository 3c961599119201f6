//! Per-user limits: how many connections one user may hold (`--user-max-connections`), and how
//! fast it may put (`--user-put-rate`). A connection over the first is refused when it
//! authenticates (the beanstalk port's, which acts as `--beanstalk-user`, when it is accepted);
//! the second is never an error: as Kafka's client quotas do, a put over the rate is answered
//! late, and its connection is *muted* — neither read nor answered — until then, so a producer
//! slows to the rate without seeing a failure, and nobody else waits.
//!
//! The rate is kept per user, over all its connections, by the generic cell rate algorithm: a
//! user's *theoretical arrival time* moves on by `1/rate` per put, never from before now, and
//! a put is late by how far that time runs ahead of now beyond one second's worth
//! ([`PUT_BURST_WINDOW`]): a user may put a second's worth at once, then `rate` a second. That
//! is one number per user and no timer; the loop's one timer is the earliest mute's end, kept
//! here in a min-heap of `(time, slot, generation)` like the connection deadlines in
//! `limits.rs`.
//!
//! Who is limited is the loop's to say: every user but the bootstrap administrator (and so
//! every node of the cluster, which log in as it) and an open server's connections (no
//! `--user`: no user is known). This file decides and counts; refusing, muting and waking
//! connections is the loop's (`Server::mute_throttled`, `Server::unmute_due`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use slab::Slab;
use tarq_engine::Micros;
use tarq_ops::stats::UserFigures;

use crate::core::access::UserRefused;

/// How far ahead of the rate a user may put at once: a second's worth of puts. A producer
/// that wakes up with a small backlog sends it at full speed; one that keeps sending is held to
/// the rate within a second (Kafka's quota window is a second by default too).
pub const PUT_BURST_WINDOW: Micros = 1_000_000;

/// Longest one mute lasts. A user whose connections together run further ahead than this (a
/// `put_many` of thousands at a low rate, many connections at once) waits this long per reply
/// and stays behind the rate until its arrival time is reached again; no connection sits
/// muted long enough for its client's own timeouts to give up on it (Kafka bounds its
/// throttle time by its quota window in the same way).
pub const MAX_PUT_DELAY: Micros = 10_000_000;

/// Users whose figures are kept at once. A user is known here from its first connection on, so
/// `/metrics` keeps its counters after it disconnects; the table holds at most twice as many
/// names as the server keeps users (`tarq_engine::users::MAX_USERS`), and past that forgets
/// the ones with no connection open.
pub const MAX_TRACKED_USERS: usize = 2 * tarq_engine::users::MAX_USERS;

#[derive(Debug)]
struct Entry {
    figures: UserFigures,
    /// Theoretical arrival time of the next put, in nanoseconds of the monotonic clock (a put
    /// every microsecond or faster has an interval under one microsecond).
    tat: u64,
}

/// Every user's connections, rate and figures, and the connections muted now.
#[derive(Debug, Default)]
pub struct Quotas {
    users: Slab<Entry>,
    by_name: HashMap<Box<str>, usize>,
    /// `(end, slot, generation)` of each mute; one live entry per muted connection.
    mutes: BinaryHeap<Reverse<(Micros, usize, u32)>>,
    /// Connections refused at a user's limit since start (all users).
    pub refused: u64,
    /// Puts answered late since start (all users).
    pub puts_delayed: u64,
}

impl Quotas {
    /// Counts a connection of user `name` (returning the key to release it by), or refuses it
    /// when the user holds `limit` already (0: no limit; `own`: the user's own, not the
    /// server's).
    pub fn admit(&mut self, name: &str, (limit, own): (usize, bool)) -> Result<usize, UserRefused> {
        let key = self.key_of(name);
        let f = &mut self.users[key].figures;
        if limit > 0 && f.connections as usize >= limit {
            f.refused += 1;
            self.refused += 1;
            return Err(UserRefused {
                user: name.into(),
                limit,
                own,
            });
        }
        f.connections += 1;
        Ok(key)
    }

    /// A connection [`admit`](Self::admit) counted under `key` is gone.
    pub fn release(&mut self, key: usize) {
        if let Some(e) = self.users.get_mut(key) {
            e.figures.connections = e.figures.connections.saturating_sub(1);
        }
    }

    /// Connections of user `name` now.
    pub fn connections_of(&self, name: &str) -> u64 {
        (self.by_name.get(name)).map_or(0, |&k| self.users[k].figures.connections)
    }

    /// Charges `puts` puts at `now` to the user under `key`, at `rate` puts a second: how long
    /// its answer should wait (0: not at all), at most [`MAX_PUT_DELAY`].
    pub fn charge(&mut self, key: usize, puts: u64, rate: u64, now: Micros) -> Micros {
        let Some(e) = self.users.get_mut(key) else {
            return 0;
        };
        if rate == 0 {
            return 0;
        }
        let now_ns = now.saturating_mul(1_000);
        let interval = 1_000_000_000 / rate.min(1_000_000_000);
        e.tat = e.tat.max(now_ns) + interval.saturating_mul(puts);
        let ahead = e.tat - now_ns;
        let late = ahead.saturating_sub(PUT_BURST_WINDOW * 1_000);
        if late == 0 {
            return 0;
        }
        e.figures.puts_delayed += puts;
        self.puts_delayed += puts;
        late.div_ceil(1_000).min(MAX_PUT_DELAY)
    }

    /// Connection `(slot, gen)` of the user under `key` is muted from `now` until `until`.
    pub fn mute(&mut self, key: usize, (slot, gen): (usize, u32), now: Micros, until: Micros) {
        if let Some(e) = self.users.get_mut(key) {
            e.figures.delay += until.saturating_sub(now);
        }
        self.mutes.push(Reverse((until, slot, gen)));
    }

    /// The earliest end of a mute, for the poll timeout.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.mutes.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next mute ended at `now`: `(slot, generation)`. The caller skips it if the slot
    /// holds another connection now.
    pub fn pop_due(&mut self, now: Micros) -> Option<(usize, u32)> {
        let &Reverse((at, slot, gen)) = self.mutes.peek()?;
        if at > now {
            return None;
        }
        self.mutes.pop();
        Some((slot, gen))
    }

    /// Every user's figures, by name.
    pub fn figures(&self) -> Vec<UserFigures> {
        let mut all: Vec<UserFigures> = self.users.iter().map(|(_, e)| e.figures.clone()).collect();
        all.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The key of user `name`, made on first sight (forgetting users with no connection if
    /// the table is full).
    fn key_of(&mut self, name: &str) -> usize {
        if let Some(&k) = self.by_name.get(name) {
            return k;
        }
        if self.users.len() >= MAX_TRACKED_USERS {
            let users = &mut self.users;
            self.by_name.retain(|_, &mut k| {
                let idle = users[k].figures.connections == 0;
                if idle {
                    users.remove(k);
                }
                !idle
            });
        }
        let key = self.users.insert(Entry {
            figures: UserFigures {
                name: name.to_owned(),
                ..UserFigures::default()
            },
            tat: 0,
        });
        self.by_name.insert(name.into(), key);
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Micros = 1_000_000;

    #[test]
    fn a_user_at_its_limit_is_refused_until_one_of_its_connections_goes() {
        let mut q = Quotas::default();
        let a = q.admit("bob", (2, false)).unwrap();
        q.admit("bob", (2, false)).unwrap();
        let e = q.admit("bob", (2, false)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Too many connections for user 'bob': the limit is 2 (--user-max-connections)"
        );
        q.admit("carl", (2, false)).unwrap();
        q.release(a);
        q.admit("bob", (2, false)).unwrap();
        assert_eq!(q.connections_of("bob"), 2);
        let own = q.admit("bob", (2, true)).unwrap_err();
        assert_eq!(
            own.to_string(),
            "Too many connections for user 'bob': the limit is 2 (its max_connections)"
        );
        for _ in 0..5 {
            q.admit("bob", (0, false)).unwrap();
        }
        let bob = &q.figures()[0];
        assert_eq!(
            (bob.name.as_str(), bob.connections, bob.refused),
            ("bob", 7, 2)
        );
        assert_eq!(q.refused, 2);
    }

    #[test]
    fn a_second_of_puts_goes_at_once_then_the_rate_holds() {
        let mut q = Quotas::default();
        let k = q.admit("bob", (0, false)).unwrap();
        let t0 = 50 * SECOND;
        // 10 a second: ten puts at once are on time, the eleventh is 0.1 s late.
        for _ in 0..10 {
            assert_eq!(q.charge(k, 1, 10, t0), 0);
        }
        assert_eq!(q.charge(k, 1, 10, t0), SECOND / 10);
        assert_eq!(q.charge(k, 1, 10, t0), 2 * SECOND / 10);
        // Answered late, the producer comes back when told: each put is late by one interval.
        let t1 = t0 + 2 * SECOND / 10;
        assert_eq!(q.charge(k, 1, 10, t1), SECOND / 10);
        // Idle for a while, it has its burst again, and no more.
        let t2 = t1 + 10 * SECOND;
        assert_eq!(q.charge(k, 10, 10, t2), 0);
        assert_eq!(q.charge(k, 1, 10, t2), SECOND / 10);
        assert_eq!(q.puts_delayed, 4);
        assert_eq!(q.charge(k, 1, 0, t2), 0, "rate 0: no limit");
    }

    #[test]
    fn a_delay_is_bounded_and_fast_rates_do_not_round_to_nothing() {
        let mut q = Quotas::default();
        let k = q.admit("bob", (0, false)).unwrap();
        assert_eq!(q.charge(k, 1_000, 10, SECOND), MAX_PUT_DELAY);
        let fast = q.admit("fast", (0, false)).unwrap();
        // Three million a second: a third of a microsecond each; 6 million is a second late.
        assert_eq!(q.charge(fast, 3_000_000, 3_000_000, SECOND), 0);
        let late = q.charge(fast, 3_000_000, 3_000_000, SECOND);
        assert!((990_000..=1_000_000).contains(&late), "{late}");
    }

    #[test]
    fn mutes_end_in_order_and_add_up_per_user() {
        let mut q = Quotas::default();
        let k = q.admit("bob", (0, false)).unwrap();
        q.mute(k, (4, 1), 100, 300);
        q.mute(k, (5, 1), 100, 200);
        assert_eq!(q.next_deadline(), Some(200));
        assert_eq!(q.pop_due(199), None);
        assert_eq!(q.pop_due(250), Some((5, 1)));
        assert_eq!(q.pop_due(250), None);
        assert_eq!(q.pop_due(300), Some((4, 1)));
        assert_eq!(q.figures()[0].delay, 300);
    }

    #[test]
    fn a_full_table_forgets_the_users_with_no_connection() {
        let mut q = Quotas::default();
        let held = q.admit("held", (0, false)).unwrap();
        for i in 0..MAX_TRACKED_USERS {
            let k = q.admit(&format!("u{i}"), (0, false)).unwrap();
            q.release(k);
        }
        assert!(q.users.len() <= MAX_TRACKED_USERS);
        assert_eq!(q.connections_of("held"), 1);
        q.release(held);
        assert_eq!(q.connections_of("held"), 0);
    }
}
