//! What travels on a link between two nodes of a sharded cluster, in tarq's own IPROTO: every
//! request is a CALL of [`ASK`] whose one argument is an [`Ask`] as MessagePack bytes (serde,
//! `rmp-serde`), every answer an OK whose DATA is one [`Answer`] the same way. A forwarded
//! call is a [`Call`], the link's own type, which the owner turns into the core's command, so
//! it runs there exactly as a local one.
//! A link starts with a CALL of [`LINK`] (after AUTH when the cluster has a password) that
//! names the calling node, the link protocol's [`LINK_VERSION`] and the cluster, and proves the
//! cluster's link key ([`proof`]); a node refuses a link without it.

use std::sync::LazyLock;

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tarq_cluster::LinkKey;
use tarq_engine::{
    MovedDedup, MovedTask, Stats, TaskId, TaskRef, TubeIx, TubeNumbers, TubeOptions, TubeType,
};

use super::call::Call;
use crate::core::{Listed, MoveReport, Outcome, Refusal, TaskFigures};

/// The call that turns an IPROTO connection into a link.
pub const LINK: &str = "tarq.link";
/// The call that carries one [`Ask`].
pub const ASK: &str = "tarq.ask";

/// A forwarding node's request.
#[derive(Debug, Serialize, Deserialize)]
pub enum Ask<'a> {
    /// Run `command` for session `session` of node `origin` (that node's own number for it;
    /// `None`: the forwarding node's own session; a node names another when it relays a call
    /// for a partition that moved away from it).
    Run {
        session: u64,
        #[serde(borrow)]
        origin: Option<&'a str>,
        #[serde(borrow)]
        call: Call<'a>,
    },
    /// Session `session` of node `origin` (`None`: the forwarding node) ended: what it holds
    /// here goes back to ready.
    End {
        session: u64,
        #[serde(borrow)]
        origin: Option<&'a str>,
    },
    /// A move's first step, from a partition's owner to the primary of replica set `to`:
    /// hold partition `index` of tube `name` (made as the owner has it, numbering on from
    /// `numbers`), empty, for the pages that follow. Answered `Ok` once the copy is claimed
    /// in etcd for move `id` (`tarq_cluster::moves`), which its commit requires. Every step
    /// names its move, so a step of an earlier move is never taken for this one's.
    MoveIn {
        id: u64,
        index: u16,
        #[serde(borrow)]
        name: &'a str,
        kind: TubeType,
        opts: TubeOptions,
        numbers: TubeNumbers,
        #[serde(borrow)]
        to: &'a str,
    },
    /// A page of the moving partition: its tasks, each Taken one's holder (a session named
    /// as [`Ask::Run`] names one), and its dedup keys. Answered `Count` once durable.
    MoveTasks {
        id: u64,
        index: u16,
        tasks: Vec<MovedTask>,
        holders: Vec<Option<(Option<String>, u64)>>,
        dedup: Vec<MovedDedup>,
        /// Tasks that went since their copy was sent.
        gone: Vec<TaskId>,
        /// The tasks are sent again (changed since their copy): each replaces its copy.
        again: bool,
        /// The partition's numbering as it ends on the old owner (the last page's).
        numbers: Option<TubeNumbers>,
        /// The old owner's wall clock when it read the page: the tasks' instants are on that
        /// clock, and the new owner moves them onto its own (nodes' clocks differ).
        read_at: tarq_engine::Micros,
    },
    /// The move's end: committed (the new owner serves the partition from now on, before
    /// its own view of the placement — newer than `epoch` — says so), or not (it withdraws
    /// its claim and drops its copy, unless etcd says the move committed after all).
    MoveDone {
        id: u64,
        index: u16,
        committed: bool,
        epoch: i64,
    },
    /// The moves the set's primary runs: answered with a [`MoveReport`] (the console's picture
    /// of every move in flight).
    Moves,
    /// The watch (`Command::Watch`) the forwarding node sent on this link as request `sync` is
    /// needed no more (no take waits on its tube there now): it is dropped, unanswered.
    /// Answered `Ok`, whether or not it still waited.
    Unwatch { sync: u64 },
    /// `count` of the forwarding node's takes wait on the tube whose first partition is
    /// `tube` (this node owns it): counted in its consumers, until the next such ask or the
    /// link's end. Answered `Ok`.
    Waiting { tube: TubeIx, count: u64 },
    /// The drop whose check (`Call::DropCheck`) of partition `index` the forwarding node
    /// asked here was given up before its commit (another partition refused, or etcd refused
    /// the commit): the partition, held since its check, serves again. Answered `Ok`.
    DropOff { index: u16 },
}

/// An owner's answer: an [`Outcome`] of the kinds a forwarded command can have, tasks
/// borrowing the reply frame.
#[derive(Debug, Serialize, Deserialize)]
pub enum Answer<'a> {
    Task(#[serde(borrow)] TaskRef<'a>),
    Done(#[serde(borrow)] TaskRef<'a>),
    DoneId {
        id: TaskId,
        number: u64,
    },
    Nothing,
    Ready(u16),
    Full,
    Count(u64),
    Ok,
    Dropped,
    TubeStats(Stats),
    TubeFigures {
        stats: Stats,
        urgent: u64,
    },
    TaskFigures(Box<TaskFigures>),
    Text(String),
    Error(Refusal),
    /// One partition's tasks of a listing (`Command::ListTasks`).
    Tasks(Vec<Listed>),
    /// A primary's moves (`Ask::Moves`).
    Moves(Box<MoveReport>),
}

impl<'a> Answer<'a> {
    /// The answer for `outcome`; an outcome no forwarded command has (the server's figures, a
    /// tube's description) travels as its debug text, never silently lost.
    pub fn of(outcome: &'a Outcome<'_>) -> Answer<'a> {
        match outcome {
            Outcome::Task(t) => Answer::Task(*t),
            Outcome::Done(t) => Answer::Done(t.as_ref()),
            Outcome::DoneId { id, number } => Answer::DoneId {
                id: *id,
                number: *number,
            },
            Outcome::Nothing => Answer::Nothing,
            Outcome::Ready(t) => Answer::Ready(*t),
            Outcome::Full => Answer::Full,
            Outcome::Count(n) => Answer::Count(*n),
            Outcome::Ok => Answer::Ok,
            Outcome::Dropped => Answer::Dropped,
            Outcome::TubeStats(s) => Answer::TubeStats(*s),
            Outcome::TubeFigures { stats, urgent } => Answer::TubeFigures {
                stats: *stats,
                urgent: *urgent,
            },
            Outcome::TaskFigures(f) => Answer::TaskFigures(f.clone()),
            Outcome::Text(t) => Answer::Text(t.clone()),
            Outcome::Error(r) => Answer::Error(r.clone()),
            Outcome::Tube(t) => Answer::Text(format!("tube {}", t.name)),
            Outcome::ServerStats(_) => Answer::Text("server stats".into()),
            Outcome::AllStats(_) => Answer::Text("every tube's figures".into()),
            Outcome::Tasks(tasks) => Answer::Tasks(tasks.clone()),
            Outcome::TaskPage(_) => Answer::Text("a tube's page of tasks".into()),
            Outcome::Moves(m) => Answer::Moves(m.clone()),
        }
    }

    /// The outcome to hand a front-end (a task that left the queue is copied).
    pub fn outcome(self) -> Outcome<'a> {
        match self {
            Answer::Task(t) => Outcome::Task(t),
            Answer::Done(t) => Outcome::Done(t.to_task()),
            Answer::DoneId { id, number } => Outcome::DoneId { id, number },
            Answer::Nothing => Outcome::Nothing,
            Answer::Ready(t) => Outcome::Ready(t),
            Answer::Full => Outcome::Full,
            Answer::Count(n) => Outcome::Count(n),
            Answer::Ok => Outcome::Ok,
            Answer::Dropped => Outcome::Dropped,
            Answer::TubeStats(s) => Outcome::TubeStats(s),
            Answer::TubeFigures { stats, urgent } => Outcome::TubeFigures { stats, urgent },
            Answer::TaskFigures(f) => Outcome::TaskFigures(f),
            Answer::Text(t) => Outcome::Text(t),
            Answer::Error(r) => Outcome::Error(r),
            Answer::Tasks(tasks) => Outcome::Tasks(tasks),
            Answer::Moves(m) => Outcome::Moves(m),
        }
    }
}

/// The body of every CALL of [`ASK`] up to its arguments.
static ASK_HEAD: LazyLock<Vec<u8>> = LazyLock::new(|| tarq_iproto::client::call_head(ASK));

/// Appends a CALL of [`ASK`] carrying `ask`, encoded in place.
pub fn write_ask(out: &mut Vec<u8>, sync: u64, ask: &Ask<'_>) {
    tarq_iproto::client::call_with_head(out, sync, &ASK_HEAD, |o| {
        rmp::encode::write_array_len(o, 1).expect("a Vec grows");
        write_bin_with(o, |o| {
            rmp_serde::encode::write(o, ask).expect("an ask always encodes")
        });
    });
}

/// Appends a MessagePack bin that `write` fills: a 32-bit length written once the bytes are.
fn write_bin_with(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    out.push(0xc6);
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    write(out);
    let len = u32::try_from(out.len() - at - 4).expect("a link message under 4 GiB");
    out[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// The link protocol's version, sent in the handshake. Raised whenever an [`Ask`] or
/// [`Answer`] changes shape: nodes of two versions cannot understand each other's messages, so
/// a link between them is refused by name (a rolling upgrade moves a set's partitions off it,
/// or upgrades the whole cluster set by set while the links between old and new wait). Version
/// 1 was the handshake of the node's name alone, before links proved the cluster's key; 2
/// moved tasks with their instants on the old owner's wall clock; 4 added [`Ask::Unwatch`];
/// 5 [`Ask::Waiting`]; 6 carried calls as the link's own [`Call`], not the core's command;
/// 7 added [`Ask::DropOff`] (an owner holds a partition's changes from a drop's check on).
/// `golden.rs` holds each version to its bytes.
pub const LINK_VERSION: u32 = 7;

/// What a node says when it opens a link: its name, the link protocol it speaks, its cluster,
/// and its proof of the cluster's link key ([`proof`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    pub origin: &'a str,
    pub version: u32,
    pub cluster: &'a str,
    pub proof: &'a [u8],
}

/// The arguments of a CALL of [`LINK`]: `[origin, {version, cluster, proof}]`.
pub fn write_link_args(out: &mut Vec<u8>, hello: &Hello<'_>) {
    use tarq_iproto::mp::write;
    write::array_len(out, 2);
    write::str(out, hello.origin);
    write::map_len(out, 3);
    write::str(out, "version");
    write::uint(out, u64::from(hello.version));
    write::str(out, "cluster");
    write::str(out, hello.cluster);
    write::str(out, "proof");
    write::bin(out, hello.proof);
}

/// The [`Hello`] in a CALL of [`LINK`]. A node of version 1 sends its name alone: read as
/// version 1, for the refusal to say which node to upgrade.
pub fn read_link_hello(args: &[u8]) -> Result<Hello<'_>, String> {
    let mut r = tarq_iproto::mp::Reader::new(args);
    let usage = || format!("{LINK} takes the calling node's name and its handshake map");
    let n = r.read_array_len().map_err(|_| usage())?;
    if !(1..=2).contains(&n) {
        return Err(usage());
    }
    let origin = (r.read_str())
        .map_err(|e| format!("{LINK}: the calling node's name is not a string: {e}"))?;
    let mut hello = Hello {
        origin,
        version: 1,
        cluster: "",
        proof: &[],
    };
    if n == 1 {
        return Ok(hello);
    }
    let bad = |what: &str, e: tarq_iproto::mp::MpError| format!("{LINK}: {what}: {e}");
    let fields = r
        .read_map_len()
        .map_err(|e| bad("the handshake is not a map", e))?;
    for _ in 0..fields {
        match r.read_str().map_err(|e| bad("a handshake key", e))? {
            "version" => {
                let v = r.read_uint().map_err(|e| bad("version", e))?;
                hello.version = u32::try_from(v).unwrap_or(u32::MAX);
            }
            "cluster" => hello.cluster = r.read_str().map_err(|e| bad("cluster", e))?,
            "proof" => hello.proof = r.read_str_or_bin().map_err(|e| bad("proof", e))?,
            _ => {
                r.skip_value().map_err(|e| bad("a handshake value", e))?;
            }
        }
    }
    Ok(hello)
}

/// Proof that a node opening a link knows the cluster's key: HMAC-SHA256 under the key of the
/// accepting connection's greeting salt, the cluster's name and the node's name. The salt is
/// fresh for every connection, so a proof seen on the wire opens no other link.
pub fn proof(key: &LinkKey, salt: &[u8], cluster: &str, origin: &str) -> [u8; 32] {
    proof_mac(key, salt, cluster, origin)
        .finalize()
        .into_bytes()
        .into()
}

/// The arguments of the [`LINK`] call node `origin` of `cluster` makes on a connection whose
/// greeting gave `salt`: this release's version and the proof of `key`.
pub fn handshake_args(key: &LinkKey, salt: &[u8], cluster: &str, origin: &str) -> Vec<u8> {
    let proof = proof(key, salt, cluster, origin);
    let hello = Hello {
        origin,
        version: LINK_VERSION,
        cluster,
        proof: &proof,
    };
    let mut args = Vec::new();
    write_link_args(&mut args, &hello);
    args
}

/// Whether `hello`'s proof is the one [`proof`] makes (compared in constant time).
pub fn proof_matches(key: &LinkKey, salt: &[u8], cluster: &str, hello: &Hello<'_>) -> bool {
    proof_mac(key, salt, cluster, hello.origin)
        .verify_slice(hello.proof)
        .is_ok()
}

fn proof_mac(key: &LinkKey, salt: &[u8], cluster: &str, origin: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).expect("HMAC takes any key");
    // Each part length-prefixed: no two (cluster, origin) pairs give the same bytes.
    for part in [salt, cluster.as_bytes(), origin.as_bytes()] {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    mac
}

/// The [`Ask`] in a CALL's arguments.
pub fn read_ask(args: &[u8]) -> Result<Ask<'_>, String> {
    let bin = one_bin(args)?;
    rmp_serde::from_slice(bin).map_err(|e| format!("a link request that does not decode: {e}"))
}

/// Appends the answer to request `sync`, encoded in place.
pub fn write_answer(out: &mut Vec<u8>, sync: u64, outcome: &Outcome<'_>) {
    let start = tarq_iproto::response::begin_data(out, sync, 1);
    write_bin_with(out, |o| {
        rmp_serde::encode::write(o, &Answer::of(outcome)).expect("an answer always encodes")
    });
    tarq_iproto::response::finish(out, start);
}

/// The [`Answer`] in a reply's DATA.
pub fn read_answer(data: &[u8]) -> Result<Answer<'_>, String> {
    let bin = one_bin(data)?;
    rmp_serde::from_slice(bin).map_err(|e| format!("a link answer that does not decode: {e}"))
}

/// The one binary string in a one-item array.
fn one_bin(mut data: &[u8]) -> Result<&[u8], String> {
    let bad = |e: &dyn std::fmt::Display| format!("a link frame that is not [bin]: {e}");
    match rmp::decode::read_array_len(&mut data) {
        Ok(1) => {}
        Ok(n) => return Err(format!("a link frame of {n} items, not 1")),
        Err(e) => return Err(bad(&e)),
    }
    let len = rmp::decode::read_bin_len(&mut data).map_err(|e| bad(&e))? as usize;
    data.get(..len)
        .ok_or_else(|| "a link frame cut short".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_engine::{JobCounts, QueueError, Status, TubePut};

    #[test]
    fn an_ask_and_an_answer_decode_to_themselves() {
        let call = Call::PutIn {
            tube: 3,
            data: &[0xa1, b'x'],
            opts: TubePut {
                utube: b"key",
                ..TubePut::default()
            },
            wait: 0,
        };
        let mut out = Vec::new();
        write_ask(
            &mut out,
            9,
            &Ask::Run {
                session: 5,
                origin: Some("b0"),
                call,
            },
        );
        let frame = &out[5..];
        let req = tarq_iproto::request::decode(frame).unwrap();
        let tarq_iproto::request::RequestKind::Call { function, args, .. } = req.kind else {
            panic!("a CALL")
        };
        assert_eq!((req.sync, function), (9, ASK));
        match read_ask(args).unwrap() {
            Ask::Run {
                session,
                origin,
                call: c,
            } => assert_eq!((session, origin, c), (5, Some("b0"), call)),
            other => panic!("{other:?}"),
        }

        let task = TaskRef {
            id: 77,
            status: Status::Taken,
            runat: 0,
            pri: 2,
            ttl: None,
            ttr: Some(5),
            created: 1,
            owner: Some(4),
            data: &[0xa1, b'y'],
            tube: 3,
            deliveries: 1,
            utube: Some(b"key"),
            counts: JobCounts::default(),
        };
        for outcome in [
            Outcome::Task(task),
            Outcome::Nothing,
            Outcome::Error(Refusal::Queue(QueueError::NotFound(77))),
        ] {
            let mut out = Vec::new();
            write_answer(&mut out, 4, &outcome);
            let resp = tarq_iproto::client::decode(&out[5..]).unwrap();
            let back = read_answer(resp.data.unwrap()).unwrap().outcome();
            assert_eq!(format!("{back:?}"), format!("{outcome:?}"));
        }
    }
}
