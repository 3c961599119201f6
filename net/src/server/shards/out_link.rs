//! A link this node opened to another replica set's primary, to forward its clients' calls
//! for the partitions that set owns: one non-blocking IPROTO connection per set, many calls in
//! flight on it (each its own sync). This is the link's protocol, without its socket (the
//! loop's, `server::link_sockets`, handed to the router for a call): the bytes read are given
//! to it, the bytes to write taken from it. It reads the
//! greeting, authenticates with this tarq's own `--user`/`--password` (a cluster shares its
//! credentials), calls `tarq.link` with its name, the link protocol's version and a proof of the
//! cluster's link key over the greeting's salt (`wire::proof`), and then carries [`Ask`]s; the frames queued before the
//! greeting arrived follow it in order. A link that fails is dropped: the calls in flight on it
//! are answered with the failure, and the next forwarded call opens a new one.

use tarq_engine::Micros;
use tarq_iproto::codes::{ER_OUTCOME_UNKNOWN, ER_READONLY};
use tarq_iproto::greeting::GREETING_LEN;
use tarq_iproto::{auth, client, split_frame};

use crate::config::Credentials;
use crate::core::Refusal;
use crate::frontend::link::wire::{self, Ask};

/// A forwarded call's answer: the DATA of its reply, or what its error means here.
pub(crate) type Answered<'a> = Result<&'a [u8], Refusal>;

/// What an owner's error reply means to the node that forwarded the call: a refusal by a node
/// that does not lead did nothing (`NoPrimary`, so a take moves on and a client may retry); an
/// owner that could not confirm a change it made says so (`Unknown`); anything else failed.
pub(crate) fn refusal_of(code: u32, message: &str) -> Refusal {
    match code {
        ER_READONLY => Refusal::NoPrimary(format!("the owner refused: {message}")),
        ER_OUTCOME_UNKNOWN => Refusal::Unknown(format!("the owner says: {message}")),
        _ => Refusal::Shards(message.to_owned()),
    }
}

/// The next whole answer in `input` from `*used` on: its sync and its DATA, or the error it
/// carries. The handshake's answers are checked here and not returned. Err: the link is
/// unusable (a frame that does not decode, the link refused).
pub(crate) fn next_answer<'a>(
    input: &'a [u8],
    used: &mut usize,
) -> Result<Option<(u64, Answered<'a>)>, String> {
    loop {
        let Some(f) = split_frame(&input[*used..], MAX_ANSWER).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let frame = &input[*used + f.prefix..*used + f.total()];
        *used += f.total();
        let resp = client::decode(frame).map_err(|e| e.to_string())?;
        if resp.sync < FIRST_CALL_SYNC {
            if !resp.is_ok() {
                let why = resp.error.unwrap_or("no message");
                return Err(format!("the primary refused the link: {why}"));
            }
            continue;
        }
        let answer = match (resp.is_ok(), resp.data) {
            (true, Some(data)) => Ok(data),
            (true, None) => Err(Refusal::Shards("an answer without data".to_owned())),
            (false, _) => Err(refusal_of(
                resp.code,
                resp.error.unwrap_or("an error without a message"),
            )),
        };
        return Ok(Some((resp.sync, answer)));
    }
}

/// The largest answer accepted: a task at the payload limit and its envelope.
const MAX_ANSWER: usize = 64 << 20;

/// Sync numbers below this are the link's own (AUTH, the `tarq.link` call).
pub(crate) const FIRST_CALL_SYNC: u64 = 16;
const AUTH_SYNC: u64 = 1;
const LINK_SYNC: u64 = 2;
/// A PING asking whether a silent link's other end is still there.
const PING_SYNC: u64 = 3;

pub(crate) struct OutLink {
    /// Unique per link opened: input taken out is given back only to the link it came from.
    pub id: u64,
    greeted: bool,
    rbuf: Vec<u8>,
    /// Frames to write (after the greeting's answer: the handshake first).
    wbuf: Vec<u8>,
    /// Frames queued before the greeting arrived.
    held: Vec<u8>,
    /// Who this node is, said in the handshake.
    who: Identity,
    /// When it began connecting, and when a byte last came from the other end (monotonic µs).
    opened_at: Micros,
    last_heard: Micros,
    /// When the last PING was sent, while the link was silent.
    pinged_at: Option<Micros>,
    /// When the other end's greeting came (monotonic µs).
    greeted_at: Option<Micros>,
}

/// What a node says of itself when it opens a link.
pub(crate) struct Identity {
    /// This node's name.
    pub me: std::sync::Arc<str>,
    /// Its cluster's name.
    pub cluster: std::sync::Arc<str>,
    /// The cluster's link key, proven, never sent.
    pub key: tarq_cluster::LinkKey,
}

impl OutLink {
    /// A link just opened at `now`, `id` unique among this node's links, saying `who` this
    /// node is once greeted.
    pub fn new(id: u64, who: Identity, now: Micros) -> OutLink {
        OutLink {
            id,
            greeted: false,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            held: Vec::new(),
            who,
            opened_at: now,
            last_heard: now,
            pinged_at: None,
            greeted_at: None,
        }
    }

    /// Whether calls may have reached the other side: once greeted, queued calls are written
    /// behind the handshake, and the owner runs what it reads even if it refuses the link
    /// later in the same turn.
    pub fn may_have_sent(&self) -> bool {
        self.greeted
    }

    /// When it began connecting (monotonic µs).
    pub fn opened_at(&self) -> Micros {
        self.opened_at
    }

    /// When the other end greeted it, once it has (monotonic µs).
    pub fn greeted_at(&self) -> Option<Micros> {
        self.greeted_at
    }

    /// Bytes queued and not written yet (behind the greeting, or unread by the other end).
    pub fn unsent_bytes(&self) -> usize {
        self.wbuf.len() + self.held.len()
    }

    /// Queues `ask` as request `sync`.
    pub fn send(&mut self, sync: u64, ask: &Ask<'_>) {
        let buf = if self.greeted {
            &mut self.wbuf
        } else {
            &mut self.held
        };
        wire::write_ask(buf, sync, ask);
    }

    /// Where the socket reads into.
    pub fn input(&mut self) -> &mut Vec<u8> {
        &mut self.rbuf
    }

    /// `read` bytes came into [`input`](Self::input) at `now`; handshakes once the greeting
    /// is whole. Err: the greeting does not read.
    pub fn read_done(
        &mut self,
        read: usize,
        cred: Option<&Credentials>,
        now: Micros,
    ) -> Result<(), String> {
        if read > 0 {
            self.last_heard = now;
            self.pinged_at = None;
        }
        if !self.greeted && self.rbuf.len() >= GREETING_LEN {
            let greeting: Vec<u8> = self.rbuf.drain(..GREETING_LEN).collect();
            let g = client::parse_greeting(&greeting)
                .map_err(|e| format!("the link's greeting: {e}"))?;
            if let Some(cred) = cred {
                let scramble = auth::scramble(&g.salt, &cred.password);
                client::auth(&mut self.wbuf, AUTH_SYNC, &cred.user, &scramble);
            }
            let who = &self.who;
            let args = wire::handshake_args(&who.key, &g.salt, &who.cluster, &who.me);
            client::call(&mut self.wbuf, LINK_SYNC, wire::LINK, &args);
            self.wbuf.append(&mut self.held);
            self.greeted = true;
            self.greeted_at = Some(now);
        }
        Ok(())
    }

    /// The answers read so far, taken out to be handled in place (given back with
    /// [`give_back`](Self::give_back)); empty until the link is greeted.
    pub fn take_input(&mut self) -> Vec<u8> {
        if self.greeted {
            std::mem::take(&mut self.rbuf)
        } else {
            Vec::new()
        }
    }

    /// The input taken, less the `used` bytes of answers handled (a read may have added more
    /// meanwhile: it goes after).
    pub fn give_back(&mut self, mut input: Vec<u8>, used: usize) {
        input.drain(..used);
        input.append(&mut self.rbuf);
        self.rbuf = input;
    }

    /// Whether the other end still answers, at `now`, with `timeout` the longest silence (µs;
    /// 0: never taken for dead): a link silent for a quarter of it is pinged (the answer, like
    /// any byte, counts as heard), and one silent for all of it — or not greeted within it —
    /// is dead. A TCP connection to a host cut off by the network stays open for minutes;
    /// this is how the calls on it get their answer.
    /// Err: taken for dead, and why. [`next_check`](Self::next_check) says when to look again.
    pub fn check(&mut self, now: Micros, timeout: Micros) -> Result<(), String> {
        if timeout == 0 {
            return Ok(());
        }
        let secs = timeout as f64 / 1e6;
        if !self.greeted {
            if now >= self.opened_at + timeout {
                return Err(format!("no greeting within {secs} s of connecting"));
            }
            return Ok(());
        }
        if now >= self.last_heard + timeout {
            return Err(format!("nothing heard for {secs} s, pings unanswered"));
        }
        let every = (timeout / 4).max(1);
        if now >= self.pinged_at.unwrap_or(self.last_heard) + every {
            client::ping(&mut self.wbuf, PING_SYNC);
            self.pinged_at = Some(now);
        }
        Ok(())
    }

    /// When [`check`](Self::check) should look next, as it would say (no ping sent).
    pub fn next_check(&self, timeout: Micros) -> Option<Micros> {
        if timeout == 0 {
            return None;
        }
        if !self.greeted {
            return Some(self.opened_at + timeout);
        }
        let every = (timeout / 4).max(1);
        let next_ping = self.pinged_at.unwrap_or(self.last_heard) + every;
        Some(next_ping.min(self.last_heard + timeout))
    }

    /// What to write, and whether more is to come before anything is answered (the other
    /// end's greeting, and with it the handshake): the socket watches for writability while
    /// either holds.
    pub fn output(&mut self) -> (&mut Vec<u8>, bool) {
        (&mut self.wbuf, !self.greeted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_iproto::request::{self, RequestKind};

    fn link(now: Micros) -> OutLink {
        let who = Identity {
            me: "a1".into(),
            cluster: "c".into(),
            key: tarq_cluster::LinkKey([7; tarq_cluster::link_key::LINK_KEY_LEN]),
        };
        OutLink::new(FIRST_CALL_SYNC, who, now)
    }

    /// The requests written, as (sync, called function or None).
    fn written(out: &[u8]) -> Vec<(u64, Option<String>)> {
        let mut at = 0;
        let mut seen = Vec::new();
        while let Some(f) = split_frame(&out[at..], usize::MAX).expect("whole frames") {
            let r = request::decode(&out[at + f.prefix..at + f.total()]).expect("a request");
            let function = match r.kind {
                RequestKind::Call { function, .. } => Some(function.to_owned()),
                _ => None,
            };
            seen.push((r.sync, function));
            at += f.total();
        }
        seen
    }

    #[test]
    fn calls_queued_before_the_greeting_follow_the_handshake() {
        let mut l = link(0);
        l.send(FIRST_CALL_SYNC, &Ask::Unwatch { sync: 99 });
        let (out, more) = l.output();
        assert!(
            out.is_empty() && more,
            "nothing is written before the greeting"
        );
        assert!(!l.may_have_sent());
        assert!(l.take_input().is_empty(), "no answers before the greeting");

        let greeting =
            tarq_iproto::greeting::encode(&[1; 16], &[2; tarq_iproto::greeting::SALT_LEN]);
        l.input().extend_from_slice(&greeting[..10]);
        l.read_done(10, None, 5).expect("half a greeting waits");
        assert!(l.output().0.is_empty());
        l.input().extend_from_slice(&greeting[10..]);
        l.read_done(greeting.len() - 10, None, 6)
            .expect("a greeting");

        let (out, more) = l.output();
        let seen = written(out);
        assert_eq!(seen[0], (LINK_SYNC, Some(wire::LINK.to_owned())));
        assert_eq!(
            seen[1].0, FIRST_CALL_SYNC,
            "the held call after the handshake"
        );
        assert_eq!(seen.len(), 2);
        assert!(!more);
        assert!(l.may_have_sent());
        assert_eq!(l.greeted_at(), Some(6));
    }

    #[test]
    fn a_silent_link_is_pinged_then_taken_for_dead() {
        let timeout = 4_000;
        let mut l = link(0);
        assert_eq!(
            l.next_check(timeout),
            Some(timeout),
            "a greeting is awaited"
        );
        assert!(
            l.check(timeout, timeout).is_err(),
            "no greeting within the timeout"
        );

        let mut l = link(0);
        let greeting =
            tarq_iproto::greeting::encode(&[1; 16], &[2; tarq_iproto::greeting::SALT_LEN]);
        l.input().extend_from_slice(&greeting);
        l.read_done(greeting.len(), None, 0).expect("a greeting");
        l.output().0.clear();
        l.check(999, timeout).expect("alive");
        assert!(
            l.output().0.is_empty(),
            "not pinged before a quarter of the timeout"
        );
        l.check(1_000, timeout).expect("alive");
        assert_eq!(written(l.output().0), [(PING_SYNC, None)]);
        assert_eq!(l.next_check(timeout), Some(2_000), "the next ping's time");
        l.read_done(1, None, 1_500).expect("an answer heard");
        assert_eq!(l.next_check(timeout), Some(2_500));
        let dead = l
            .check(5_500, timeout)
            .expect_err("silent for the whole timeout");
        assert!(dead.contains("nothing heard"), "{dead}");
        assert_eq!(
            link(0).next_check(0),
            None,
            "a timeout of 0 never takes it for dead"
        );
    }
}
