//! Tubes made and dropped while the faults run, with puts racing each drop. A dropper thread
//! creates a tube (`drop1`, `drop2`, ...: a name is never used twice), lets the racers put
//! into it for a while, drops it, and keeps it named to the racers a little longer, so puts
//! keep arriving at every node while the drop commits and after it answered. The checker then
//! holds the drop to its promise: no put invoked after a tube's drop answered ok is itself
//! answered ok (`checker::AFTER_DROP`), and the puts a drop took with it are not counted lost.
//!
//! A tube whose drop was never seen to answer ok (the dropper stopped, a fault broke the call)
//! is drained with the run's own tubes once the faults are healed, unless no node has it any
//! more ([`settle_left`]): what was acknowledged into a tube that stays is delivered.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Result;
use rmpv::Value;
use tarq_client::{pack_args, Client, ClientError};

use crate::history::{Kind, F};
use crate::net::Host;
use crate::workload::{outcome_of, Outcome, Recorder, Target};

/// How long a call waits for its reply (a put held by a drop's check waits up to 5 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a tube lives before its drop, at most.
const LIFE_MS: std::ops::Range<u64> = 300..1_500;
/// How long the racers go on putting into a tube after its drop answered.
const AFTER_DROP: Duration = Duration::from_millis(400);
/// The pause after a failed call or connect, so a dead node is not hammered.
const BACKOFF: Duration = Duration::from_millis(50);
/// Drops the dropper tries before it leaves a tube to the end of the run.
const DROP_TRIES: usize = 20;
/// The pause after a refusal.
const REFUSED_PAUSE: Duration = Duration::from_millis(5);
/// A tube's name: the prefix and its number.
const PREFIX: &str = "drop";

/// The dropper's and the racers' settings.
#[derive(Debug, Clone)]
pub struct DropSpec {
    /// The dropper's process; the racers' follow it.
    pub first_process: u64,
    pub racers: usize,
    pub targets: Vec<Target>,
    /// The host whose namespace their sockets are in.
    pub host: Host,
    pub seed: u64,
    /// The tubes' partitions (a sharded cluster), or none.
    pub partitions: Option<u16>,
}

/// The tube the racers put into now, if any.
type Current = Arc<Mutex<Option<String>>>;

/// The running threads: the dropper (it returns the tubes it made whose drop it did not see
/// answer ok, for [`settle_left`]) and the racers.
pub struct Dropping {
    pub dropper: JoinHandle<Vec<String>>,
    pub racers: Vec<JoinHandle<()>>,
}

/// Starts the dropper and the racers; they run until `stop`.
pub fn spawn(spec: DropSpec, rec: Arc<Recorder>, stop: Arc<AtomicBool>) -> Result<Dropping> {
    let current: Current = Arc::new(Mutex::new(None));
    let mut racers = Vec::new();
    for k in 0..spec.racers {
        let process = spec.first_process + 1 + k as u64;
        let (spec, rec, stop, current) = (
            spec.clone(),
            Arc::clone(&rec),
            Arc::clone(&stop),
            Arc::clone(&current),
        );
        let thread = std::thread::Builder::new()
            .name(format!("racer-{process}"))
            .spawn(move || {
                spec.host
                    .enter_current_thread()
                    .expect("enter the clients' namespace");
                let mut caller = Caller::new(&spec.targets, process, rec);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let tube = current
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone();
                    let Some(tube) = tube else {
                        // Nothing to put into until the dropper names a tube (a pace).
                        std::thread::sleep(BACKOFF);
                        continue;
                    };
                    n += 1;
                    let payload = format!("r{process}-{n}");
                    let _ = caller.call(F::Put, &tube, Some(payload));
                }
            })?;
        racers.push(thread);
    }
    let dropper = std::thread::Builder::new()
        .name("dropper".into())
        .spawn(move || {
            spec.host
                .enter_current_thread()
                .expect("enter the clients' namespace");
            let mut rng = fastrand::Rng::with_seed(spec.seed ^ 0x6472_6f70);
            let mut caller = Caller::new(&spec.targets, spec.first_process, rec);
            let mut left = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let tube = format!("{PREFIX}{n}");
                if !caller.create(&tube, spec.partitions, &stop) {
                    // Stopped before the tube was made: it may exist, so it is settled after.
                    left.push(tube);
                    break;
                }
                *current.lock().unwrap_or_else(PoisonError::into_inner) = Some(tube.clone());
                std::thread::sleep(Duration::from_millis(rng.u64(LIFE_MS)));
                if caller.drop_within(&tube, DROP_TRIES, &stop) == Answer::Ok {
                    // The race the check is about: puts that reach the nodes after the drop
                    // answered.
                    std::thread::sleep(AFTER_DROP);
                } else {
                    left.push(tube);
                }
                *current.lock().unwrap_or_else(PoisonError::into_inner) = None;
            }
            left
        })?;
    Ok(Dropping { dropper, racers })
}

/// Once the faults are healed, sorts the tubes the dropper left: one no node has any more
/// (an earlier drop of unknown outcome removed it) gets a drop recorded as `process`, which
/// fails naming it gone; the others are returned, to be drained as the run's own tubes are,
/// so what was acknowledged into them is checked like any other put.
pub fn settle_left(
    targets: &[Target],
    host: &Host,
    rec: Arc<Recorder>,
    process: u64,
    left: &[String],
) -> Result<Vec<String>> {
    host.enter_current_thread()?;
    let mut caller = Caller::new(targets, process, rec);
    let mut live = Vec::new();
    for tube in left {
        if caller.gone_everywhere(tube) {
            let _ = caller.call(F::Drop, tube, None);
        } else {
            live.push(tube.clone());
        }
    }
    Ok(live)
}

/// How a call came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    /// A definite error.
    Refused,
    /// A drop refused because no node has the tube any more: an earlier drop of unknown
    /// outcome removed it.
    Gone,
    /// Unknown (the connection is dropped), or no node could be reached.
    Unknown,
}

/// One process's connection, moved to another node when one fails or refuses.
struct Caller {
    process: u64,
    targets: Vec<SocketAddr>,
    names: Vec<String>,
    next: usize,
    conn: Option<Client>,
    rec: Arc<Recorder>,
}

impl Caller {
    fn new(targets: &[Target], process: u64, rec: Arc<Recorder>) -> Caller {
        Caller {
            process,
            targets: targets.iter().map(|t| t.addr).collect(),
            names: targets.iter().map(|t| t.name.clone()).collect(),
            next: process as usize % targets.len().max(1),
            conn: None,
            rec,
        }
    }

    fn connected(&mut self) -> Option<&mut Client> {
        if self.conn.is_none() {
            match Client::connect_addr(self.targets[self.next], REPLY_TIMEOUT) {
                Ok(c) => self.conn = Some(c),
                Err(_) => {
                    self.move_on();
                    std::thread::sleep(BACKOFF);
                    return None;
                }
            }
        }
        self.conn.as_mut()
    }

    fn move_on(&mut self) {
        self.conn = None;
        self.next = (self.next + 1) % self.targets.len();
    }

    /// `queue.create_tube(tube, 'fifottl', {partitions = n})`, not recorded (no check reads
    /// it); tried through each node in turn until it answers ok or `stop`.
    fn create(&mut self, tube: &str, partitions: Option<u16>, stop: &AtomicBool) -> bool {
        let mut args = vec![Value::from(tube), Value::from("fifottl")];
        if let Some(n) = partitions {
            args.push(Value::Map(vec![(
                Value::from("partitions"),
                Value::from(n),
            )]));
        }
        let args = pack_args(&args);
        while !stop.load(Ordering::Relaxed) {
            let Some(c) = self.connected() else { continue };
            match c.call("queue.create_tube", &args, None) {
                Ok(_) => return true,
                Err(ClientError::Server { message, .. }) if message.contains("already exists") => {
                    return true
                }
                Err(_) => {
                    self.move_on();
                    std::thread::sleep(BACKOFF);
                }
            }
        }
        false
    }

    /// Drops `tube`, trying again (through the next node) after a refusal or an unknown
    /// outcome, up to `tries` calls or `stop`.
    fn drop_within(&mut self, tube: &str, tries: usize, stop: &AtomicBool) -> Answer {
        let mut answer = Answer::Unknown;
        for _ in 0..tries {
            answer = self.call(F::Drop, tube, None);
            if matches!(answer, Answer::Ok | Answer::Gone) || stop.load(Ordering::Relaxed) {
                break;
            }
        }
        answer
    }

    /// A put (`payload`) or a drop of `tube`, recorded, and how it came out.
    fn call(&mut self, f: F, tube: &str, payload: Option<String>) -> Answer {
        let node = self.names[self.next].clone();
        if self.connected().is_none() {
            return Answer::Unknown;
        }
        let mut e = self.rec.event(self.process, Kind::Invoke, f);
        e.node = Some(node);
        e.tube = Some(tube.to_owned());
        e.payload = payload;
        self.rec.record(&e);
        let (function, args) = match &e.payload {
            Some(p) => ("put", vec![Value::from(p.as_str())]),
            None => ("drop", Vec::new()),
        };
        let name = format!("queue.tube.{tube}:{function}");
        let c = self.conn.as_mut().expect("connected above");
        let outcome = outcome_of(c.call(&name, &pack_args(&args), None));
        e.time_us = self.rec.now_us();
        let answer = match outcome {
            Outcome::Ok(done) => {
                e.kind = Kind::Ok;
                e.id = done.id;
                Answer::Ok
            }
            Outcome::Fail(why) | Outcome::ReadOnly(why, _) => {
                e.kind = Kind::Fail;
                if f == F::Drop && self.gone_everywhere(tube) {
                    // What an earlier drop of unknown outcome did: the tube is gone.
                    e.error = Some(format!("{why}; {GONE}"));
                    Answer::Gone
                } else {
                    e.error = Some(why);
                    Answer::Refused
                }
            }
            Outcome::Info(why) => {
                e.kind = Kind::Info;
                e.error = Some(why);
                Answer::Unknown
            }
        };
        self.rec.record(&e);
        match answer {
            Answer::Ok | Answer::Gone => {}
            // A refusal may name another primary, or a node that lost its view: try the next,
            // after a client's pause (a put into a dropped tube is refused at once).
            Answer::Refused => {
                self.move_on();
                std::thread::sleep(REFUSED_PAUSE);
            }
            Answer::Unknown => {
                self.move_on();
                std::thread::sleep(BACKOFF);
            }
        }
        answer
    }

    /// Whether every node says `tube` does not exist (`queue.statistics(tube)`): one that
    /// has it, or does not answer, may still serve it (a replica behind its primary says so
    /// of a tube just made, so no one node's word is enough).
    fn gone_everywhere(&mut self, tube: &str) -> bool {
        let args = pack_args(&[Value::from(tube)]);
        self.targets.iter().all(|&addr| {
            let Ok(mut c) = Client::connect_addr(addr, REPLY_TIMEOUT) else {
                return false;
            };
            matches!(
                c.call("queue.statistics", &args, None),
                Err(ClientError::Server { message, .. }) if message.contains("does not exist")
            )
        })
    }
}

/// How a failed drop says the tube was gone already: an earlier drop of unknown outcome did
/// remove it (`checker`).
pub const GONE: &str = "the tube does not exist";
