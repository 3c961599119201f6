//! What a client may make the server hold, and for how long, whatever protocol it speaks: the
//! server-wide budget for input bytes (partial frames, request heads), the per-address
//! connection cap, and the deadlines of a connection (a started frame must finish, an
//! unauthenticated connection must authenticate, an idle one may be closed). Every front-end
//! (IPROTO, beanstalk and HTTP connections, any later protocol) keeps a [`Guard`] per
//! connection and calls the same [`Limits`]: admit and release an address, settle the bytes its
//! input buffer holds, report input, and close what [`Limits::check`] says has expired. The
//! counts of every refusal and closure live here too, for the stats. The settings and their
//! defaults are the configuration's ([`crate::config::limits`]).
//!
//! Deadlines cost nothing per request: a connection has at most one live entry in a min-heap of
//! `(time, slot, generation)`, pushed only when a deadline earlier than its armed one appears (a
//! frame starts). Input just records its time; when an entry comes due the connection's
//! deadlines are recomputed from its state, and it is either closed or re-armed. Entries of
//! closed or re-armed connections are skipped when they come due (and dropped in bulk if they
//! ever outnumber live connections).
//!
//! This file decides and counts; closing, logging and telling the client are the front-end's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::IpAddr;

use tarq_engine::Micros;

use crate::config::LimitsConfig;

/// Largest frame accepted before a connection has authenticated (when a user is configured).
/// An AUTH (user name, method, 20-byte scramble), a PING or an ID is well under 100 bytes; 4 KiB
/// leaves room for any sane user name, and stays inside the resting read buffer, so an
/// unauthenticated connection never makes the server grow it.
pub const MAX_PRE_AUTH_FRAME_BYTES: usize = 4096;

/// Input read per loop turn beyond what connections with small frames read (their resting
/// buffer's worth each), over all connections together. Reading a byte of a big frame costs
/// copying it and, for fresh buffer memory, a page fault: ~0.5 ms per 2 MiB on a busy core,
/// so a thousand connections each sending a big frame cannot stretch one turn (and every
/// other client's reply) past that, while a genuine big frame still arrives at gigabytes a
/// second on an otherwise idle loop (turns follow each other at once while input waits).
pub const TURN_INPUT_BYTES: usize = 2 << 20;

/// Heap entries allowed per live connection before dead ones are swept out: a live connection
/// has one, plus a superseded one or two that the sweep or their time removes.
const ENTRIES_PER_CONN: usize = 4;

/// Heap entries always allowed, so a quiet server never sweeps.
const MIN_ENTRIES: usize = 1024;

/// Why a connection is closed by its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// A frame started and did not finish within the frame timeout.
    Frame,
    /// Not authenticated within the auth timeout.
    Auth,
    /// Nothing sent within the idle timeout.
    Idle,
}

impl Expiry {
    /// The reason logged with the closure.
    pub fn reason(self) -> &'static str {
        match self {
            Expiry::Frame => "frame not finished within frame-timeout",
            Expiry::Auth => "not authenticated within auth-timeout",
            Expiry::Idle => "idle for idle-timeout",
        }
    }

    /// The setting that fired, with its value (for the message to the client).
    pub fn setting(self, cfg: &LimitsConfig) -> (&'static str, Micros) {
        match self {
            Expiry::Frame => ("frame-timeout", cfg.frame_timeout),
            Expiry::Auth => ("auth-timeout", cfg.auth_timeout),
            Expiry::Idle => ("idle-timeout", cfg.idle_timeout),
        }
    }
}

/// Counts of what the limits refused or closed, since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounts {
    pub frame_timeouts: u64,
    pub auth_timeouts: u64,
    pub idle_timeouts: u64,
    /// Connections closed to bring the input budget back under its limit.
    pub budget_evictions: u64,
    /// Frames refused (and their connections closed) for being too big before authentication.
    pub pre_auth_frames_refused: u64,
    /// Connections refused at the per-address cap.
    pub peer_refusals: u64,
    /// HTTP connections closed for not finishing a request in time (`frame-timeout`; counted
    /// in `frame_timeouts` too).
    pub http_timeouts: u64,
}

/// A connection refused at the per-address cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Too many connections from {peer}: the limit is {limit} per address (--max-connections-per-peer)")]
pub struct PeerRefused {
    pub peer: IpAddr,
    pub limit: usize,
}

/// One connection's side of the limits; the front-end keeps it beside its buffers.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Bytes of input buffer not counted (the resting buffer every connection has).
    resting: usize,
    /// Bytes charged to the input budget now.
    charged: usize,
    /// When the frame now in the buffer started arriving, if one is partial.
    frame_started: Option<Micros>,
    opened: Micros,
    last_input: Micros,
    /// Time of this connection's live heap entry.
    armed: Option<Micros>,
}

impl Guard {
    pub fn charged(&self) -> usize {
        self.charged
    }

    pub fn frame_started(&self) -> Option<Micros> {
        self.frame_started
    }
}

/// How far an input buffer may grow now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCap {
    pub bytes: usize,
    /// The budget, not the frame cap, set `bytes`: a full buffer means waiting for room.
    pub by_budget: bool,
}

/// The server-wide limits; see the module doc.
#[derive(Debug)]
pub struct Limits {
    cfg: LimitsConfig,
    /// Bytes charged by every guard.
    held: usize,
    live: usize,
    deadlines: BinaryHeap<Reverse<(Micros, usize, u32)>>,
    peers: HashMap<IpAddr, u32>,
    /// What is left of [`TURN_INPUT_BYTES`] this turn.
    turn_input_left: usize,
    pub counts: LimitCounts,
}

impl Limits {
    pub fn new(cfg: LimitsConfig) -> Limits {
        Limits {
            cfg,
            held: 0,
            live: 0,
            deadlines: BinaryHeap::with_capacity(MIN_ENTRIES),
            peers: HashMap::new(),
            turn_input_left: TURN_INPUT_BYTES,
            counts: LimitCounts::default(),
        }
    }

    pub fn config(&self) -> &LimitsConfig {
        &self.cfg
    }

    /// New settings (a reload). Deadlines armed already fire at their time and are then
    /// recomputed under the new settings.
    pub fn reconfigure(&mut self, cfg: LimitsConfig) {
        self.cfg = cfg;
    }

    /// Bytes charged to the input budget now.
    pub fn held(&self) -> usize {
        self.held
    }

    // -- addresses --------------------------------------------------------------------------

    /// Counts a new connection from `peer`, or refuses it at the per-address cap.
    pub fn admit(&mut self, peer: IpAddr) -> Result<(), PeerRefused> {
        let n = self.peers.entry(peer).or_insert(0);
        let limit = self.cfg.max_connections_per_peer;
        if limit > 0 && *n as usize >= limit {
            if *n == 0 {
                self.peers.remove(&peer);
            }
            self.counts.peer_refusals += 1;
            return Err(PeerRefused { peer, limit });
        }
        *n += 1;
        self.live += 1;
        Ok(())
    }

    /// A connection admitted from `peer` is gone.
    pub fn release(&mut self, peer: IpAddr) {
        if let Some(n) = self.peers.get_mut(&peer) {
            *n -= 1;
            if *n == 0 {
                self.peers.remove(&peer);
            }
            self.live -= 1;
        }
    }

    /// Connections from `peer` now.
    pub fn connections_from(&self, peer: IpAddr) -> usize {
        self.peers.get(&peer).map_or(0, |&n| n as usize)
    }

    // -- the input budget ---------------------------------------------------------------------

    /// A guard for a connection just admitted at `now`, whose input buffer rests at `resting`
    /// bytes. Its first deadline (authentication, idleness) is armed under `slot`/`gen`.
    pub fn open(
        &mut self,
        resting: usize,
        now: Micros,
        authenticated: bool,
        (slot, gen): (usize, u32),
    ) -> Guard {
        let mut g = Guard {
            resting,
            opened: now,
            last_input: now,
            ..Guard::default()
        };
        // Room for this connection's entries, reserved here rather than on the request path.
        let want = self.live.max(1) * ENTRIES_PER_CONN;
        if self.deadlines.capacity() < want {
            self.deadlines.reserve(want - self.deadlines.len());
        }
        if let Some((at, _)) = self.next_of(&g, authenticated) {
            self.arm(&mut g, slot, gen, at);
        }
        g
    }

    /// How far the buffer of `g` may grow: up to `frame_cap`, as far as the budget allows.
    /// Growing costs no turn allowance: a big buffer is fresh zero pages that cost only when
    /// input is read into them (see `conn::MMAP_THRESHOLD_BYTES`), and reading is what the
    /// allowance bounds.
    pub fn read_cap(&self, g: &Guard, frame_cap: usize) -> ReadCap {
        let room = self.cfg.input_budget.saturating_sub(self.held);
        let by_budget = (g.resting + g.charged + room).max(g.resting);
        let bytes = frame_cap.min(by_budget);
        ReadCap {
            bytes,
            by_budget: bytes == by_budget && bytes < frame_cap,
        }
    }

    /// A new loop turn: the per-turn input allowance is whole again.
    pub fn turn_start(&mut self) {
        self.turn_input_left = TURN_INPUT_BYTES;
    }

    /// What `g` reads each turn outside the turn's allowance: its resting buffer's worth while
    /// its buffer is at rest (small frames: a client that behaves is always read), nothing
    /// once it has grown for a big frame (big frames share the turn's allowance, so a thousand
    /// of them arriving at once cost one allowance a turn, not a thousand resting buffers).
    fn free_read(g: &Guard) -> usize {
        if g.charged == 0 {
            g.resting
        } else {
            0
        }
    }

    /// Bytes `g` may read this turn: its free read, plus what is left of the turn's allowance,
    /// at most `per_conn`.
    pub fn read_allowance(&self, g: &Guard, per_conn: usize) -> usize {
        Self::free_read(g)
            .saturating_add(self.turn_input_left)
            .min(per_conn)
    }

    /// Records that `g` read `bytes` this turn: what it read over its free read comes out of
    /// the turn's allowance.
    pub fn spend(&mut self, g: &Guard, bytes: usize) {
        let over = bytes.saturating_sub(Self::free_read(g));
        self.turn_input_left = self.turn_input_left.saturating_sub(over);
    }

    /// Records that `g`'s input buffer now holds `allocated` bytes.
    pub fn settle(&mut self, g: &mut Guard, allocated: usize) {
        let now = allocated.saturating_sub(g.resting);
        self.held = self.held - g.charged + now;
        g.charged = now;
    }

    /// Whether the budget is spent (a growth was refused, or a reload lowered it).
    pub fn budget_full(&self) -> bool {
        self.held >= self.cfg.input_budget
    }

    // -- deadlines ----------------------------------------------------------------------------

    /// Records input on `g` at `now`: `read` bytes arrived, frames were completed (or not), and
    /// a partial frame is (or is not) left in the buffer. Arms the frame deadline when a frame
    /// starts; nothing else is touched per request.
    #[inline]
    pub fn note_input(
        &mut self,
        g: &mut Guard,
        (slot, gen): (usize, u32),
        now: Micros,
        read: bool,
        completed: bool,
        partial: bool,
    ) {
        if read {
            g.last_input = now;
        }
        if completed || !partial {
            g.frame_started = partial.then_some(now);
        } else if g.frame_started.is_none() {
            g.frame_started = Some(now);
        }
        if let Some(started) = g.frame_started {
            if self.cfg.frame_timeout > 0 {
                let at = started.saturating_add(self.cfg.frame_timeout);
                if g.armed.is_none_or(|a| at < a) {
                    self.arm(g, slot, gen, at);
                }
            }
        } else if g.armed.is_none() && self.cfg.idle_timeout > 0 {
            let at = g.last_input.saturating_add(self.cfg.idle_timeout);
            self.arm(g, slot, gen, at);
        }
    }

    /// The earliest armed deadline, for the poll timeout.
    pub fn next_deadline(&self) -> Option<Micros> {
        self.deadlines.peek().map(|Reverse((at, _, _))| *at)
    }

    /// The next entry due at `now`: `(slot, generation, time)`. The caller looks the connection
    /// up, skips it if the slot holds another generation, and otherwise calls
    /// [`check`](Self::check) with the time.
    pub fn pop_due(&mut self, now: Micros) -> Option<(usize, u32, Micros)> {
        let &Reverse((at, slot, gen)) = self.deadlines.peek()?;
        if at > now {
            return None;
        }
        self.deadlines.pop();
        Some((slot, gen, at))
    }

    /// A due entry of `g` (armed for `at`): the deadline that has passed, counted, or `None`
    /// with the connection re-armed for its next one. `busy` (a take waiting for a task)
    /// counts as activity. An entry superseded by an earlier one is ignored.
    pub fn check(
        &mut self,
        g: &mut Guard,
        (slot, gen): (usize, u32),
        at: Micros,
        now: Micros,
        authenticated: bool,
        busy: bool,
    ) -> Option<Expiry> {
        if g.armed != Some(at) {
            return None;
        }
        g.armed = None;
        if busy {
            g.last_input = now;
        }
        let (next, why) = self.next_of(g, authenticated)?;
        if next > now {
            self.arm(g, slot, gen, next);
            return None;
        }
        let c = &mut self.counts;
        match why {
            Expiry::Frame => c.frame_timeouts += 1,
            Expiry::Auth => c.auth_timeouts += 1,
            Expiry::Idle => c.idle_timeouts += 1,
        }
        Some(why)
    }

    /// Drops the entries of connections `live` says are gone, once there are many of them:
    /// called on accept, so a storm of short connections cannot grow the heap.
    pub fn sweep(&mut self, live: impl Fn(usize, u32) -> bool) {
        if self.deadlines.len() > MIN_ENTRIES.max(self.live * ENTRIES_PER_CONN) {
            self.deadlines
                .retain(|&Reverse((_, slot, gen))| live(slot, gen));
        }
    }

    /// The earliest deadline of `g` and which one it is.
    fn next_of(&self, g: &Guard, authenticated: bool) -> Option<(Micros, Expiry)> {
        let c = &self.cfg;
        let frame = g
            .frame_started
            .filter(|_| c.frame_timeout > 0)
            .map(|t| (t.saturating_add(c.frame_timeout), Expiry::Frame));
        let auth = (!authenticated && c.auth_timeout > 0)
            .then(|| (g.opened.saturating_add(c.auth_timeout), Expiry::Auth));
        let idle = (c.idle_timeout > 0)
            .then(|| (g.last_input.saturating_add(c.idle_timeout), Expiry::Idle));
        [frame, auth, idle]
            .into_iter()
            .flatten()
            .min_by_key(|d| d.0)
    }

    fn arm(&mut self, g: &mut Guard, slot: usize, gen: u32, at: Micros) {
        g.armed = Some(at);
        self.deadlines.push(Reverse((at, slot, gen)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESTING: usize = 16;
    const ID: (usize, u32) = (3, 7);

    fn cfg() -> LimitsConfig {
        LimitsConfig {
            input_budget: 100,
            frame_timeout: 1_000,
            auth_timeout: 5_000,
            idle_timeout: 0,
            max_connections_per_peer: 2,
        }
    }

    /// Pops every entry due at `now` for the one connection under test.
    fn due(l: &mut Limits, g: &mut Guard, now: Micros, authenticated: bool) -> Option<Expiry> {
        let mut fired = None;
        while let Some((slot, gen, at)) = l.pop_due(now) {
            assert_eq!((slot, gen), ID);
            fired = fired.or(l.check(g, ID, at, now, authenticated, false));
        }
        fired
    }

    #[test]
    fn the_budget_caps_growth_and_settles_both_ways() {
        let mut l = Limits::new(cfg());
        let mut a = l.open(RESTING, 0, true, ID);
        let mut b = l.open(RESTING, 0, true, ID);
        assert_eq!(
            l.read_cap(&a, 1000),
            ReadCap {
                bytes: RESTING + 100,
                by_budget: true
            }
        );
        assert_eq!(
            l.read_cap(&a, 50).bytes,
            50,
            "the frame cap when it is lower"
        );
        l.settle(&mut a, RESTING + 70);
        assert_eq!((l.held(), a.charged()), (70, 70));
        // b may take only what is left; a keeps what it holds plus the rest.
        assert_eq!(l.read_cap(&b, 1000).bytes, RESTING + 30);
        assert_eq!(l.read_cap(&a, 1000).bytes, RESTING + 100);
        l.settle(&mut b, RESTING + 30);
        assert!(l.budget_full());
        assert_eq!(l.read_cap(&b, 1000).bytes, RESTING + 30, "no more room");
        l.settle(&mut a, RESTING);
        assert_eq!((l.held(), a.charged()), (30, 0));
        assert!(!l.budget_full());
        l.settle(&mut b, 0);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn each_turn_reads_a_bounded_amount_beyond_resting_buffers() {
        let mut l = Limits::new(cfg());
        let g = l.open(RESTING, 0, true, ID);
        let per_conn = 2 * TURN_INPUT_BYTES;
        assert_eq!(l.read_allowance(&g, per_conn), RESTING + TURN_INPUT_BYTES);
        assert_eq!(l.read_allowance(&g, 100), 100, "the per-connection cap");
        l.spend(&g, RESTING + TURN_INPUT_BYTES - 5);
        assert_eq!(l.read_allowance(&g, per_conn), RESTING + 5);
        assert_eq!(
            l.read_cap(&g, RESTING + 50),
            ReadCap {
                bytes: RESTING + 50,
                by_budget: false
            },
            "growth is held by the budget and the frame cap, not by the turn's allowance"
        );
        l.spend(&g, RESTING + 10);
        // Spent: every connection still reads its resting buffer's worth.
        assert_eq!(l.read_allowance(&g, per_conn), RESTING);
        l.spend(&g, RESTING);
        assert_eq!(l.read_allowance(&g, per_conn), RESTING);
        l.turn_start();
        assert_eq!(l.read_allowance(&g, per_conn), RESTING + TURN_INPUT_BYTES);
    }

    #[test]
    fn a_connection_assembling_a_big_frame_reads_only_from_the_turns_allowance() {
        let mut l = Limits::new(cfg());
        let mut big = l.open(RESTING, 0, true, ID);
        let small = l.open(RESTING, 0, true, ID);
        l.settle(&mut big, 4 * RESTING);
        let per_conn = 2 * TURN_INPUT_BYTES;
        assert_eq!(l.read_allowance(&big, per_conn), TURN_INPUT_BYTES);
        l.spend(&big, TURN_INPUT_BYTES);
        assert_eq!(
            l.read_allowance(&big, per_conn),
            0,
            "spent: a grown buffer waits for the next turn"
        );
        assert_eq!(
            l.read_allowance(&small, per_conn),
            RESTING,
            "a buffer at rest still reads its resting worth"
        );
        l.turn_start();
        assert_eq!(l.read_allowance(&big, per_conn), TURN_INPUT_BYTES);
    }

    #[test]
    fn the_per_address_cap_counts_refusals_and_releases() {
        let mut l = Limits::new(cfg());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        l.admit(ip).unwrap();
        l.admit(ip).unwrap();
        let e = l.admit(ip).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Too many connections from 10.0.0.1: the limit is 2 per address \
             (--max-connections-per-peer)"
        );
        l.admit(other).unwrap();
        assert_eq!(l.counts.peer_refusals, 1);
        l.release(ip);
        assert_eq!(l.connections_from(ip), 1);
        l.admit(ip).unwrap();
        l.reconfigure(LimitsConfig {
            max_connections_per_peer: 0,
            ..cfg()
        });
        for _ in 0..10 {
            l.admit(ip).unwrap();
        }
        assert_eq!(l.connections_from(ip), 12);
    }

    #[test]
    fn a_started_frame_must_finish_in_time() {
        let mut l = Limits::new(cfg());
        let mut g = l.open(RESTING, 0, true, ID);
        assert_eq!(l.next_deadline(), None, "nothing to wait for");
        l.note_input(&mut g, ID, 100, true, false, true);
        assert_eq!(l.next_deadline(), Some(1_100));
        // More bytes of the same frame do not move its deadline.
        l.note_input(&mut g, ID, 900, true, false, true);
        assert_eq!(due(&mut l, &mut g, 1_099, true), None);
        assert_eq!(due(&mut l, &mut g, 1_100, true), Some(Expiry::Frame));
        assert_eq!(l.counts.frame_timeouts, 1);
    }

    #[test]
    fn a_frame_that_finishes_disarms_and_the_next_one_starts_its_own_clock() {
        let mut l = Limits::new(cfg());
        let mut g = l.open(RESTING, 0, true, ID);
        l.note_input(&mut g, ID, 100, true, false, true);
        l.note_input(&mut g, ID, 600, true, true, true); // done, and another one begun
        assert_eq!(
            due(&mut l, &mut g, 1_100, true),
            None,
            "re-armed, not fired"
        );
        assert_eq!(l.next_deadline(), Some(1_600));
        l.note_input(&mut g, ID, 1_200, true, true, false); // done, nothing partial
        assert_eq!(due(&mut l, &mut g, 10_000, true), None);
        assert_eq!(l.next_deadline(), None);
        assert_eq!(l.counts, LimitCounts::default());
    }

    #[test]
    fn an_unauthenticated_connection_expires_unless_it_authenticates() {
        let mut l = Limits::new(cfg());
        let mut g = l.open(RESTING, 0, false, ID);
        assert_eq!(l.next_deadline(), Some(5_000));
        assert_eq!(due(&mut l, &mut g, 5_000, false), Some(Expiry::Auth));
        let mut g = l.open(RESTING, 0, false, ID);
        assert_eq!(due(&mut l, &mut g, 5_000, true), None, "authenticated");
        assert_eq!(l.next_deadline(), None);
        assert_eq!(l.counts.auth_timeouts, 1);
    }

    #[test]
    fn idleness_counts_from_the_last_input_and_a_waiting_take_is_not_idle() {
        let mut l = Limits::new(LimitsConfig {
            idle_timeout: 2_000,
            ..cfg()
        });
        let mut g = l.open(RESTING, 0, true, ID);
        assert_eq!(l.next_deadline(), Some(2_000));
        l.note_input(&mut g, ID, 1_500, true, true, false);
        assert_eq!(due(&mut l, &mut g, 2_000, true), None, "it spoke at 1500");
        assert_eq!(l.next_deadline(), Some(3_500));
        // A take waiting for a task keeps it alive.
        let (slot, gen, at) = l.pop_due(3_500).unwrap();
        assert_eq!(l.check(&mut g, (slot, gen), at, 3_500, true, true), None);
        assert_eq!(l.next_deadline(), Some(5_500));
        assert_eq!(due(&mut l, &mut g, 5_500, true), Some(Expiry::Idle));
        assert_eq!(l.counts.idle_timeouts, 1);
    }

    #[test]
    fn entries_of_closed_connections_are_swept_out() {
        let mut l = Limits::new(cfg());
        for slot in 0..3 * MIN_ENTRIES {
            let ip = IpAddr::from([10, 0, (slot >> 8) as u8, slot as u8]);
            l.admit(ip).unwrap();
            l.open(RESTING, 0, false, (slot, 1));
            l.release(ip);
        }
        l.sweep(|_, _| false);
        assert_eq!(l.next_deadline(), None);
    }
}
