//! `tarq ctl move`, `tarq ctl rebalance` and `tarq ctl drain`: moving partitions with their
//! tasks between the replica sets of a sharded cluster. The move itself is the server's
//! (`tarq.move`, run by the primary of the set that owns the partition, while traffic runs:
//! it commits by one etcd transaction or is given up and leaves the partition where it was);
//! this module finds whom to ask, plans which partitions go where, and runs the plan one move
//! at a time.
//!
//! The plans are pure functions of the partitions and the live sets (those with a primary),
//! so their rules are tested without a cluster:
//! - **by count** ([`plan_by_count`]): greedy, from the set owning the most partitions (of
//!   every tube) to the one owning the fewest until every live set owns within one of every
//!   other; of the most loaded set's partitions, one of the tube it holds most of compared
//!   with the receiver (so each tube spreads too), the one with the fewest tasks first.
//! - **by tasks** ([`plan_by_tasks`]): greedy, from the set holding the most tasks to the one
//!   holding the fewest, the partition whose move brings the two closest, until no move would
//!   narrow the gap; the counts are the owners' at planning time (traffic changes them).
//! - **drain** ([`plan_drain`]): every partition of one set, each to the live set owning the
//!   fewest partitions then.
//!
//! Before a move is sent, the owner's primary is given until `--timeout` to own the partition
//! and know the new set's primary in its own view (it reads etcd a moment after a change),
//! and a refusal it says will pass (a stale view, a partition that has just moved there,
//! another move running there) is asked again until `--timeout`; any other refusal is final.
//!
//! Running a plan re-reads the map from etcd before each move and skips a move whose
//! partition is no longer where the plan found it (someone else moved or placed it). SIGINT
//! stops a run between moves: the move in flight runs to its end on the server (committed or
//! given up, never half done) and no further move is started.
//!
//! It talks to etcd (the map) and to the primaries (the moves, the counts); the node at
//! `--addr` is asked only where etcd is, when `--etcd` or `--cluster` is left out.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use clap::{Args, ValueEnum};
use rmpv::Value;
use serde::{Deserialize, Serialize};
use tarq_client::cluster::{map_get, Options};
use tarq_client::{pack_args, Client, ClientError};
use tarq_cluster::etcd::Client as Etcd;
use tarq_cluster::placement::{self, ClusterMap};

use super::cluster::{call_on, connect, partitions};

/// Shortest wait for a move's answer: a move copies every task of the partition and answers
/// once it has committed, so a big partition takes far longer than an ordinary call's
/// `--timeout`. Ten minutes covers millions of tasks; a longer `--timeout` wins.
pub const MOVE_WAIT: Duration = Duration::from_secs(600);

/// How often the owner's primary is asked whether its view of the placement has caught up
/// with etcd's before a move is sent there.
const VIEW_POLL: Duration = Duration::from_millis(50);

/// Where the cluster's map is: the same flags as `tarq ctl place`. Either may be left out:
/// the node at `--addr` says what it was started with ([`EtcdArgs::resolve`]).
#[derive(Debug, Clone, Args)]
pub struct EtcdArgs {
    /// etcd's client URLs, as the nodes' --etcd [default: the --addr node's].
    #[arg(long, env = "TARQ_ETCD", value_name = "URLS", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// The cluster's name in etcd, as the nodes' --cluster [default: the --addr node's].
    #[arg(long, env = "TARQ_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,
    /// The CA that signed etcd's certificate (PEM), for https:// etcd endpoints, as the
    /// nodes' --etcd-ca.
    #[arg(long, env = "TARQ_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<std::path::PathBuf>,
    /// A client certificate for etcd (PEM), when etcd runs with --client-cert-auth.
    #[arg(
        long,
        env = "TARQ_ETCD_CERT",
        value_name = "FILE",
        requires = "etcd_ca"
    )]
    pub etcd_cert: Option<std::path::PathBuf>,
    /// The private key of --etcd-cert (PEM).
    #[arg(
        long,
        env = "TARQ_ETCD_KEY",
        value_name = "FILE",
        requires = "etcd_cert"
    )]
    pub etcd_key: Option<std::path::PathBuf>,
}

/// The etcd and the cluster name a command works on, once known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Where {
    pub etcd: Vec<String>,
    pub cluster: String,
    /// How to speak TLS to an `https://` etcd (`--etcd-ca`, ...).
    pub tls: Option<tarq_cluster::EtcdTls>,
}

impl Where {
    /// A client of this etcd.
    pub fn connect(&self) -> anyhow::Result<Etcd> {
        Etcd::connect_tls(&self.etcd, self.tls.as_ref())
            .map_err(|e| anyhow!("--etcd {}: {e}", self.etcd.join(",")))
    }
}

impl EtcdArgs {
    /// etcd's TLS settings as the flags give them (`--etcd-cert` and `--etcd-key` together).
    fn tls(&self) -> anyhow::Result<Option<tarq_cluster::EtcdTls>> {
        let client = match (&self.etcd_cert, &self.etcd_key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => anyhow::bail!("--etcd-cert and --etcd-key go together"),
        };
        Ok(self
            .etcd_ca
            .clone()
            .map(|ca| tarq_cluster::EtcdTls { ca, client }))
    }

    /// `--etcd` and `--cluster`, the ones not given taken from `queue.cluster()` of the first
    /// of `addrs` that answers (a node shows the `etcd` and `cluster` it was started with).
    pub fn resolve(&self, addrs: &[String], opts: &Options) -> anyhow::Result<Where> {
        if let (false, Some(cluster)) = (self.etcd.is_empty(), &self.cluster) {
            return Ok(Where {
                etcd: self.etcd.clone(),
                cluster: cluster.clone(),
                tls: self.tls()?,
            });
        }
        let mut tried = Vec::new();
        for addr in addrs {
            let own = match call_on(addr, opts, "queue.cluster") {
                Ok(own) => own,
                Err(e) => {
                    tried.push(format!("{addr}: {e}"));
                    continue;
                }
            };
            let strings = |key: &str| -> Vec<String> {
                match map_get(&own, key) {
                    Some(Value::Array(a)) => a
                        .iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect(),
                    Some(Value::String(s)) => s.as_str().map(str::to_owned).into_iter().collect(),
                    _ => Vec::new(),
                }
            };
            let (etcd, cluster) = (strings("etcd"), strings("cluster"));
            let (Some(cluster), false) = (cluster.into_iter().next(), etcd.is_empty()) else {
                bail!(
                    "the node at {addr} runs without etcd (no --etcd, --cluster), so it cannot \
                     say where the cluster's map is: give --etcd and --cluster, or --addr a \
                     node of the sharded cluster"
                );
            };
            return Ok(Where {
                etcd: if self.etcd.is_empty() {
                    etcd
                } else {
                    self.etcd.clone()
                },
                cluster: self.cluster.clone().unwrap_or(cluster),
                tls: self.tls()?,
            });
        }
        bail!(
            "--etcd and --cluster were not given, and no node at --addr answered to tell them \
             ({}): give them (or TARQ_ETCD, TARQ_CLUSTER), or --addr a node of the cluster",
            tried.join("; ")
        )
    }
}

/// The map of `cluster` as etcd holds it, refused when etcd knows no such cluster: a wrong
/// `--cluster` reads as an empty map, and would otherwise be told as a missing tube or set.
pub fn read_map(etcd: &mut Etcd, at: &Where, budget: Duration) -> anyhow::Result<ClusterMap> {
    let cluster = &at.cluster;
    let map = placement::read(etcd, cluster, budget)
        .with_context(|| format!("reading cluster {cluster}'s map from etcd"))?;
    if map.sets.is_empty() && map.placement.tubes.is_empty() {
        bail!(
            "etcd at {} knows no cluster named {cluster:?}: no node has registered under \
             /tarq/{cluster}/. Give --cluster as the nodes' --cluster (`tarq ctl cluster` on a \
             node shows it), or leave --etcd and --cluster out to take them from --addr",
            at.etcd.join(",")
        );
    }
    Ok(map)
}

/// What `tarq ctl rebalance` evens out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Balance {
    /// The number of partitions each live set owns.
    Count,
    /// The number of tasks each live set holds, as the owners count them.
    Tasks,
}

/// One partition as a plan sees it: where it is and, when its owner counted it, its tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub tube: String,
    pub partition: u16,
    pub index: u16,
    pub set: String,
    pub tasks: Option<u64>,
}

/// One move of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub tube: String,
    pub partition: u16,
    pub from: String,
    pub to: String,
    pub tasks: Option<u64>,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} {} -> {}",
            self.tube, self.partition, self.from, self.to
        )
    }
}

/// The server's report of a move that committed (or found the partition there already).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub tube: String,
    pub partition: u16,
    pub from: String,
    pub to: String,
    pub tasks: u64,
    pub ms: u64,
    #[serde(default)]
    pub already: bool,
}

// ---------------------------------------------------------------------------------------------
// Plans, pure

/// The partitions each live set owns, in `live`'s order, given the owners in `owner`.
fn counts<'a>(live: &'a [String], owner: &[String]) -> Vec<(usize, &'a str)> {
    live.iter()
        .map(|s| (owner.iter().filter(|o| *o == s).count(), s.as_str()))
        .collect()
}

/// A set's load (partitions or tasks) and its name.
type Load<'a, N> = (N, &'a str);

/// The most and the least loaded of `loads` (ties: the first name for both).
fn extremes<'a, N: Ord + Copy>(loads: &[Load<'a, N>]) -> Option<(Load<'a, N>, Load<'a, N>)> {
    let most = loads
        .iter()
        .copied()
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1)))?;
    let least = loads.iter().copied().min()?;
    Some((most, least))
}

/// The moves that leave every set of `live` owning within one partition of every other.
/// Partitions of sets not in `live` stay where they are and are not counted: a set without a
/// primary can neither give nor take one. See the module's paragraph for the choice of
/// partition; each partition moves at most once.
pub fn plan_by_count(parts: &[Part], live: &[String]) -> Vec<Step> {
    let mut owner: Vec<String> = parts.iter().map(|p| p.set.clone()).collect();
    let mut moved = vec![false; parts.len()];
    let mut steps = Vec::new();
    loop {
        let loads = counts(live, &owner);
        let Some(((most_n, most), (least_n, least))) = extremes(&loads) else {
            break;
        };
        if most_n <= least_n + 1 {
            break;
        }
        let on = |tube: &str, set: &str| {
            (parts.iter().zip(&owner))
                .filter(|(p, o)| p.tube == tube && *o == set)
                .count() as i64
        };
        let pick = (0..parts.len())
            .filter(|&i| owner[i] == most && !moved[i])
            .min_by_key(|&i| {
                let p = &parts[i];
                let spread = on(&p.tube, most) - on(&p.tube, least);
                (-spread, p.tasks.unwrap_or(0), &p.tube, p.partition)
            });
        let Some(i) = pick else { break };
        steps.push(step(&parts[i], least));
        owner[i] = least.to_owned();
        moved[i] = true;
    }
    steps
}

/// The moves that narrow the gap between the live sets' task counts: from the set holding
/// the most to the one holding the fewest, the partition whose tasks come closest to half
/// the gap, while one moves fewer tasks than the gap (so the two end nearer than they were).
/// An uncounted partition counts as empty and is not moved; each partition moves at most
/// once.
pub fn plan_by_tasks(parts: &[Part], live: &[String]) -> Vec<Step> {
    let mut owner: Vec<String> = parts.iter().map(|p| p.set.clone()).collect();
    let mut moved = vec![false; parts.len()];
    let mut steps = Vec::new();
    loop {
        let loads: Vec<(u64, &str)> = live
            .iter()
            .map(|s| {
                let held = (parts.iter().zip(&owner))
                    .filter(|(_, o)| *o == s)
                    .map(|(p, _)| p.tasks.unwrap_or(0))
                    .sum();
                (held, s.as_str())
            })
            .collect();
        let Some(((most_n, most), (least_n, least))) = extremes(&loads) else {
            break;
        };
        let gap = most_n - least_n;
        let pick = (0..parts.len())
            .filter(|&i| owner[i] == most && !moved[i])
            .filter(|&i| parts[i].tasks.is_some_and(|t| t > 0 && t < gap))
            .min_by_key(|&i| {
                let p = &parts[i];
                let t = p.tasks.unwrap_or(0);
                (gap.abs_diff(2 * t), &p.tube, p.partition)
            });
        let Some(i) = pick else { break };
        steps.push(step(&parts[i], least));
        owner[i] = least.to_owned();
        moved[i] = true;
    }
    steps
}

/// The moves that leave `set` owning nothing: each of its partitions, in order, to the set
/// of `live` (other than `set`) that owns the fewest partitions then (ties: the first name).
/// None when no other set is live.
pub fn plan_drain(parts: &[Part], live: &[String], set: &str) -> Vec<Step> {
    let targets: Vec<String> = live.iter().filter(|s| *s != set).cloned().collect();
    let mut owner: Vec<String> = parts.iter().map(|p| p.set.clone()).collect();
    let mut steps = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        if p.set != set {
            continue;
        }
        let loads = counts(&targets, &owner);
        let Some(&(_, to)) = loads.iter().min() else {
            break;
        };
        steps.push(step(p, to));
        owner[i] = to.to_owned();
    }
    steps
}

fn step(p: &Part, to: &str) -> Step {
    Step {
        tube: p.tube.clone(),
        partition: p.partition,
        from: p.set.clone(),
        to: to.to_owned(),
        tasks: p.tasks,
    }
}

/// Every partition of every tube in `map`, tube by tube (by name), without counts.
pub fn parts_of(map: &ClusterMap) -> Vec<Part> {
    let tubes = map.placement.tubes.values();
    tubes
        .flat_map(|t| {
            t.partitions.iter().enumerate().map(|(p, placed)| Part {
                tube: t.name.clone(),
                partition: p as u16,
                index: placed.index,
                set: placed.set.clone(),
                tasks: None,
            })
        })
        .collect()
}

/// The sets with a primary now, by name.
pub fn live_sets(map: &ClusterMap) -> Vec<String> {
    (map.sets.iter())
        .filter(|s| s.leader.is_some())
        .map(|s| s.name.clone())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Talking to etcd and the primaries

/// A connection to etcd for one command, with the call options for the nodes.
struct Session<'a> {
    etcd: Etcd,
    at: Where,
    opts: &'a Options,
}

impl<'a> Session<'a> {
    fn open(args: &EtcdArgs, addrs: &[String], opts: &'a Options) -> anyhow::Result<Session<'a>> {
        let at = args.resolve(addrs, opts)?;
        let etcd = at.connect()?;
        Ok(Session { etcd, at, opts })
    }

    /// The map as etcd holds it now; each etcd call's time limit is `--timeout`.
    fn read(&mut self) -> anyhow::Result<ClusterMap> {
        read_map(&mut self.etcd, &self.at, self.opts.timeout)
    }

    /// `parts` with the task counts each live set's primary gives for the partitions its set
    /// owns; the sets whose primary did not answer, with why.
    fn count(&self, map: &ClusterMap, parts: &mut [Part]) -> Vec<(String, String)> {
        let mut silent = Vec::new();
        for s in &map.sets {
            let Some((primary, _)) = &s.leader else {
                continue;
            };
            match owned_counts(&primary.addr, self.opts) {
                Ok(counted) => {
                    for p in parts.iter_mut().filter(|p| p.set == s.name) {
                        p.tasks = counted.get(&p.index).copied();
                    }
                }
                Err(e) => silent.push((
                    s.name.clone(),
                    format!("{} ({}) {e}", primary.name, primary.addr),
                )),
            }
        }
        silent
    }

    /// One move on `map`, as etcd holds it now: asks the partition's owner's primary and
    /// waits for its report. The error says whether the partition is known to have stayed.
    fn move_one(
        &self,
        map: &ClusterMap,
        tube: &str,
        partition: u16,
        to: &str,
    ) -> anyhow::Result<(Report, String)> {
        placement::plan_place(map, tube, partition, to)
            .map_err(|e| anyhow!("{e}; nothing was changed"))?;
        let placed = &map.placement.tubes[tube].partitions[usize::from(partition)];
        let from = placed.set.as_str();
        if from == to {
            let report = Report {
                tube: tube.into(),
                partition,
                from: from.into(),
                to: to.into(),
                tasks: 0,
                ms: 0,
                already: true,
            };
            let text = serde_json::to_string(&report)?;
            return Ok((report, text));
        }
        let leader = |name: &str| {
            (map.sets.iter())
                .find(|s| s.name == name)
                .and_then(|s| s.leader.as_ref())
                .map(|(l, _)| l)
        };
        if leader(to).is_none() {
            bail!(
                "replica set {to} has no primary now to take partition {partition} of tube \
                 {tube}; nothing was changed"
            );
        }
        let Some(primary) = leader(from) else {
            bail!(
                "partition {partition} of tube {tube} is owned by replica set {from}, which has \
                 no primary now to move it; nothing was changed"
            );
        };
        let who = format!(
            "replica set {from}'s primary {} ({})",
            primary.name, primary.addr
        );
        let mut c = connect(&primary.addr, self.opts)
            .map_err(|e| anyhow!("cannot reach {who}: {e}; nothing was changed"))?;
        // A primary that took the placement from etcd a moment ago may not have read it yet:
        // it would refuse a partition etcd already gives it, or a new set it has not seen.
        self.wait_view(&mut c, placed.index, to);
        self.ask_move(&mut c, &who, tube, partition, to)
    }

    /// Asks the owner's primary on `c` (`who`) for the move and reads its report: the call is
    /// sent again while the primary says its view is passing (it read etcd a moment late).
    fn ask_move(
        &self,
        c: &mut Client,
        who: &str,
        tube: &str,
        partition: u16,
        to: &str,
    ) -> anyhow::Result<(Report, String)> {
        let wait = MOVE_WAIT.saturating_sub(self.opts.timeout);
        let args = pack_args(&[Value::from(tube), Value::from(partition), Value::from(to)]);
        let deadline = Instant::now() + self.opts.timeout;
        let answer = loop {
            match c.call("tarq.move", &args, Some(wait)) {
                Err(ClientError::Server { message, .. })
                    if passing(&message) && Instant::now() < deadline =>
                {
                    std::thread::sleep(VIEW_POLL);
                }
                answer => break answer,
            }
        };
        let answer = match answer {
            Ok(values) => values,
            Err(ClientError::Server { message, .. }) => {
                bail!("{who} refused: {message}; nothing was changed")
            }
            Err(e) => bail!(
                "no answer from {who}: {e}; the move may still be running there, or have ended \
                 either way: `tarq ctl cluster` shows where partition {partition} of tube {tube} \
                 is now"
            ),
        };
        let text = match answer.first() {
            Some(Value::String(s)) => s.as_str().unwrap_or_default().trim().to_owned(),
            other => bail!("{who} answered the move with {other:?}, not a report"),
        };
        let report = serde_json::from_str(&text)
            .with_context(|| format!("{who} answered the move with {text:?}, not a report"))?;
        Ok((report, text))
    }

    /// Waits, at most `--timeout`, until the primary on `c` owns the partition at `index` and
    /// knows set `to`'s primary in its own view; then the server's own checks decide.
    fn wait_view(&self, c: &mut Client, index: u16, to: &str) {
        let deadline = Instant::now() + self.opts.timeout;
        while Instant::now() < deadline {
            let Ok(own) = c.call("queue.cluster", &[0x90], None) else {
                return;
            };
            let own = own.into_iter().next().unwrap_or(Value::Nil);
            let owns = partitions(&own).any(|p| {
                map_get(p, "index").and_then(Value::as_u64) == Some(u64::from(index))
                    && map_get(p, "owner_here").and_then(Value::as_bool) == Some(true)
            });
            let knows = match map_get(&own, "sets") {
                Some(Value::Array(sets)) => sets.iter().any(|s| {
                    map_get(s, "name").and_then(Value::as_str) == Some(to)
                        && map_get(s, "primary").is_some_and(|p| !p.is_nil())
                }),
                _ => false,
            };
            if owns && knows {
                return;
            }
            std::thread::sleep(VIEW_POLL);
        }
    }
}

/// Whether a refusal of `tarq.move` is one the server says will pass by itself: its view of
/// the placement not read lately, a partition that has just moved to its set (held until the
/// old owner's view has run out), another move running on that node. Such a refusal is
/// asked again, until `--timeout`.
fn passing(message: &str) -> bool {
    [
        "view of the placement is stale",
        "has just moved",
        "one move at a time",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// The task counts (`total`) of the partitions the primary at `addr` owns, by index.
fn owned_counts(addr: &str, opts: &Options) -> Result<BTreeMap<u16, u64>, String> {
    let own = call_on(addr, opts, "queue.cluster").map_err(|e| format!("does not answer: {e}"))?;
    Ok(partitions(&own)
        .filter(|p| map_get(p, "owner_here").and_then(Value::as_bool) == Some(true))
        .filter_map(|p| {
            let index = map_get(p, "index").and_then(Value::as_u64)?;
            let total = map_get(p, "total").and_then(Value::as_u64)?;
            Some((u16::try_from(index).ok()?, total))
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Stopping between moves

/// Set by SIGINT: no further move is started.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
    const NOTE: &[u8] = b"\nstopping after the move in flight: it ends on the server, committed \
        or given up, never half done (Ctrl-C again leaves at once; the move still ends there)\n";
    // SAFETY: write(2) is async-signal-safe, and NOTE is a static buffer of NOTE.len() bytes.
    unsafe {
        libc::write(2, NOTE.as_ptr().cast(), NOTE.len());
    }
}

/// Makes the first SIGINT ask for a stop between moves (the second one, the default action,
/// ends ctl). System calls it interrupts are restarted, so the call in flight keeps waiting
/// for its answer.
fn stop_on_sigint() -> anyhow::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value (no flags, empty mask); the handler only
    // stores an atomic and calls write(2), both async-signal-safe; the pointers are to locals
    // that outlive the calls.
    let rc = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        let handler: extern "C" fn(libc::c_int) = on_sigint;
        sa.sa_sigaction = handler as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut())
    };
    if rc != 0 {
        bail!(
            "installing the SIGINT handler: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn stop_asked() -> bool {
    STOP.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------------
// The commands

/// `tarq ctl move TUBE PARTITION --to SET`: prints the server's report, one JSON line.
pub fn run_move(
    tube: &str,
    partition: u16,
    to: &str,
    at: &EtcdArgs,
    addrs: &[String],
    opts: &Options,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut s = Session::open(at, addrs, opts)?;
    let map = s.read()?;
    let (_, text) = s.move_one(&map, tube, partition, to)?;
    writeln!(out, "{text}")?;
    Ok(())
}

/// `tarq ctl rebalance`: plans, prints the plan, and (unless `dry_run`) runs it.
pub fn run_rebalance(
    by: Balance,
    dry_run: bool,
    at: &EtcdArgs,
    addrs: &[String],
    opts: &Options,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut s = Session::open(at, addrs, opts)?;
    let map = s.read()?;
    let live = live_sets(&map);
    if live.is_empty() {
        bail!("no replica set has a primary now: nothing can be moved");
    }
    let mut parts = parts_of(&map);
    let silent = s.count(&map, &mut parts);
    note_stranded(&map, &parts, &live, out)?;
    let steps = match by {
        Balance::Count => {
            let owners: Vec<String> = parts.iter().map(|p| p.set.clone()).collect();
            let loads = counts(&live, &owners);
            writeln!(out, "partitions per live set: {}", listed(&loads))?;
            plan_by_count(&parts, &live)
        }
        Balance::Tasks => plan_tasks(&parts, &live, &silent, out)?,
    };
    if steps.is_empty() {
        writeln!(out, "balanced already: nothing to move")?;
        return Ok(());
    }
    plan_or_dry_run(&steps, dry_run, out)?;
    if dry_run {
        return Ok(());
    }
    let done = run_plan(&mut s, &steps, out)?;
    let map = s.read()?;
    let owners: Vec<String> = parts_of(&map).into_iter().map(|p| p.set).collect();
    writeln!(
        out,
        "rebalanced: {}; partitions per live set now: {}",
        done,
        listed(&counts(&live_sets(&map), &owners))
    )?;
    Ok(())
}

/// The plan that evens out the tasks each live set holds, refused unless every owner counted
/// its partitions (`silent`: the primaries that did not answer).
fn plan_tasks(
    parts: &[Part],
    live: &[String],
    silent: &[(String, String)],
    out: &mut dyn Write,
) -> anyhow::Result<Vec<Step>> {
    if let Some((set, e)) = silent.first() {
        bail!("cannot balance by tasks: replica set {set}'s primary {e}; nothing was changed");
    }
    let uncounted: Vec<String> = (parts.iter())
        .filter(|p| p.tasks.is_none() && live.contains(&p.set))
        .map(|p| format!("{}/{}", p.tube, p.partition))
        .collect();
    if !uncounted.is_empty() {
        bail!(
            "cannot balance by tasks: no owner counts {} (just moved? try again in a moment); \
             nothing was changed",
            uncounted.join(", ")
        );
    }
    let loads: Vec<(u64, &str)> = (live.iter())
        .map(|set| {
            let held = parts
                .iter()
                .filter(|p| p.set == *set)
                .filter_map(|p| p.tasks);
            (held.sum(), set.as_str())
        })
        .collect();
    writeln!(out, "tasks per live set: {}", listed(&loads))?;
    Ok(plan_by_tasks(parts, live))
}

/// `tarq ctl drain SET`: plans, prints the plan, and (unless `dry_run`) runs it; then checks
/// that SET owns nothing.
pub fn run_drain(
    set: &str,
    dry_run: bool,
    at: &EtcdArgs,
    addrs: &[String],
    opts: &Options,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut s = Session::open(at, addrs, opts)?;
    let map = s.read()?;
    let mut parts = parts_of(&map);
    let owns = parts.iter().any(|p| p.set == set);
    let known = map.sets.iter().find(|v| v.name == set);
    match (known, owns) {
        (None, false) => {
            let sets: Vec<&str> = map.sets.iter().map(|v| v.name.as_str()).collect();
            bail!(
                "no replica set {set} in the cluster (its sets: {})",
                sets.join(", ")
            );
        }
        (_, false) => {
            writeln!(
                out,
                "replica set {set} owns no partition: nothing to move; its nodes can be stopped"
            )?;
            return Ok(());
        }
        (Some(v), true) if v.leader.is_some() => {}
        (_, true) => bail!(
            "replica set {set} has no primary now: its partitions move only through its \
             primary; nothing was changed"
        ),
    }
    let live = live_sets(&map);
    if !live.iter().any(|l| l != set) {
        bail!(
            "no other replica set has a primary now to take {set}'s partitions; nothing was \
             changed"
        );
    }
    s.count(&map, &mut parts);
    let steps = plan_drain(&parts, &live, set);
    plan_or_dry_run(&steps, dry_run, out)?;
    if dry_run {
        return Ok(());
    }
    let done = run_plan(&mut s, &steps, out)?;
    let map = s.read()?;
    let left: Vec<String> = (parts_of(&map).into_iter())
        .filter(|p| p.set == set)
        .map(|p| format!("{}/{}", p.tube, p.partition))
        .collect();
    if !left.is_empty() {
        bail!(
            "drained {done}, but replica set {set} owns {} now (placed there meanwhile?): run \
             drain again",
            left.join(", ")
        );
    }
    writeln!(
        out,
        "drained: {done}; replica set {set} owns no partition now: its nodes can be stopped"
    )?;
    Ok(())
}

/// What a run did.
#[derive(Debug, Default)]
struct Done {
    moved: usize,
    skipped: usize,
    tasks: u64,
    elapsed: Duration,
}

impl fmt::Display for Done {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} moved ({} tasks) in {} ms",
            self.moved,
            self.tasks,
            self.elapsed.as_millis()
        )?;
        if self.skipped > 0 {
            write!(f, ", {} skipped", self.skipped)?;
        }
        Ok(())
    }
}

/// Prints the plan; before a real run, SIGINT is caught first, so a Ctrl-C from the moment
/// the plan shows stops the run between moves.
fn plan_or_dry_run(steps: &[Step], dry_run: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    if !dry_run {
        stop_on_sigint()?;
    }
    writeln!(out, "plan: {} moves", steps.len())?;
    for st in steps {
        match st.tasks {
            Some(t) => writeln!(out, "move {st} ({t} tasks)")?,
            None => writeln!(out, "move {st}")?,
        }
    }
    if dry_run {
        writeln!(out, "dry run: nothing was moved")?;
    }
    out.flush()?;
    Ok(())
}

/// Runs `steps` one at a time, each on a fresh read of the map; stops at SIGINT (between
/// moves) and at the first failure.
fn run_plan(s: &mut Session<'_>, steps: &[Step], out: &mut dyn Write) -> anyhow::Result<Done> {
    let started = Instant::now();
    let mut done = Done::default();
    for (k, st) in steps.iter().enumerate() {
        if stop_asked() {
            done.elapsed = started.elapsed();
            writeln!(out, "stopped: {done}")?;
            bail!(
                "stopped by SIGINT before move {} of {}: the moves made stay made, the rest were \
                 not started",
                k + 1,
                steps.len()
            );
        }
        let map = s.read()?;
        match map.placement.owner(&st.tube, st.partition) {
            Some(owner) if owner == st.from => {}
            now => {
                let now = now.map_or("gone".to_string(), |o| format!("on {o}"));
                writeln!(
                    out,
                    "skipped {st}: the partition is {now}, not on {}",
                    st.from
                )?;
                done.skipped += 1;
                continue;
            }
        }
        match s.move_one(&map, &st.tube, st.partition, &st.to) {
            Ok((r, _)) => {
                writeln!(out, "moved {st}: {} tasks in {} ms", r.tasks, r.ms)?;
                done.moved += 1;
                done.tasks += r.tasks;
            }
            Err(e) => {
                done.elapsed = started.elapsed();
                writeln!(out, "failed {st}")?;
                writeln!(out, "stopped: {done}")?;
                return Err(e.context(format!("move {} of {} ({st})", k + 1, steps.len())));
            }
        }
        out.flush()?;
    }
    done.elapsed = started.elapsed();
    Ok(done)
}

/// A note for the partitions owned by sets without a primary: no plan moves them.
fn note_stranded(
    map: &ClusterMap,
    parts: &[Part],
    live: &[String],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    for set in &map.sets {
        let n = parts.iter().filter(|p| p.set == set.name).count();
        if n > 0 && !live.contains(&set.name) {
            writeln!(
                out,
                "replica set {} has no primary now: its {n} partitions stay where they are",
                set.name
            )?;
        }
    }
    Ok(())
}

/// `a 3, b 2, c 2`.
fn listed<N: fmt::Display>(loads: &[(N, &str)]) -> String {
    let items: Vec<String> = loads.iter().map(|(n, s)| format!("{s} {n}")).collect();
    items.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts of tube `tube`, partition p on `sets[p]` holding `tasks[p]`.
    fn tube(tube: &str, sets: &[&str], tasks: &[u64]) -> Vec<Part> {
        sets.iter()
            .enumerate()
            .map(|(p, set)| Part {
                tube: tube.into(),
                partition: p as u16,
                index: p as u16 + 1,
                set: (*set).into(),
                tasks: tasks.get(p).copied(),
            })
            .collect()
    }

    fn names(sets: &[&str]) -> Vec<String> {
        sets.iter().map(|s| s.to_string()).collect()
    }

    fn shown(steps: &[Step]) -> Vec<String> {
        steps.iter().map(Step::to_string).collect()
    }

    /// The partitions each of `live` owns after `steps`.
    fn after(parts: &[Part], steps: &[Step], live: &[&str]) -> Vec<usize> {
        let mut owner: Vec<String> = parts.iter().map(|p| p.set.clone()).collect();
        for st in steps {
            let i = (parts.iter())
                .position(|p| p.tube == st.tube && p.partition == st.partition)
                .unwrap();
            assert_eq!(owner[i], st.from, "{st} moves from where it is");
            owner[i] = st.to.clone();
        }
        live.iter()
            .map(|s| owner.iter().filter(|o| o == s).count())
            .collect()
    }

    #[test]
    fn by_count_spreads_the_partitions_within_one_moving_the_biggest_tube_first() {
        let mut parts = tube("default", &["a"], &[0]);
        parts.extend(tube("jobs", &["a"; 6], &[500, 400, 600, 500, 500, 500]));
        let live = names(&["a", "b", "c"]);
        let steps = plan_by_count(&parts, &live);
        assert_eq!(
            shown(&steps),
            [
                "jobs/1 a -> b",
                "jobs/0 a -> c",
                "jobs/3 a -> b",
                "jobs/4 a -> c"
            ]
        );
        assert_eq!(after(&parts, &steps, &["a", "b", "c"]), [3, 2, 2]);
        // Balanced already; one set; no set.
        assert!(plan_by_count(&parts, &names(&["a"])).is_empty());
        assert!(plan_by_count(&parts, &[]).is_empty());
        let even = tube("jobs", &["a", "b", "a", "b", "c"], &[]);
        assert!(plan_by_count(&even, &live).is_empty());
    }

    #[test]
    fn by_count_leaves_the_partitions_of_a_set_without_primary() {
        let parts = tube("jobs", &["a", "a", "a", "a", "x", "x", "x"], &[]);
        let steps = plan_by_count(&parts, &names(&["a", "b"]));
        assert_eq!(shown(&steps), ["jobs/0 a -> b", "jobs/1 a -> b"]);
    }

    #[test]
    fn by_tasks_narrows_the_gap_until_no_move_would() {
        let parts = tube("jobs", &["a"; 5], &[600, 100, 500, 0, 200]);
        let live = names(&["a", "b"]);
        let steps = plan_by_tasks(&parts, &live);
        // Gap 1400: 600 is the nearest to half. Then a 800, b 600, gap 200: 100 closes it.
        // The empty partition never moves.
        assert_eq!(shown(&steps), ["jobs/0 a -> b", "jobs/1 a -> b"]);
        assert!(plan_by_tasks(&tube("jobs", &["a", "b"], &[10, 10]), &live).is_empty());
        // One big partition cannot be split: moving it would only swap the sides.
        assert!(plan_by_tasks(&tube("jobs", &["a"], &[1000]), &live).is_empty());
        // Uncounted partitions stay.
        assert!(plan_by_tasks(&tube("jobs", &["a", "a"], &[]), &live).is_empty());
    }

    #[test]
    fn drain_gives_each_partition_to_the_set_owning_fewest() {
        let mut parts = tube("jobs", &["a", "b", "c", "c", "c", "a", "c"], &[]);
        parts.extend(tube("mail", &["c"], &[]));
        let live = names(&["a", "b", "c"]);
        let steps = plan_drain(&parts, &live, "c");
        assert_eq!(
            shown(&steps),
            [
                "jobs/2 c -> b",
                "jobs/3 c -> a",
                "jobs/4 c -> b",
                "jobs/6 c -> a",
                "mail/0 c -> b"
            ]
        );
        assert_eq!(after(&parts, &steps, &["a", "b", "c"]), [4, 4, 0]);
        assert!(plan_drain(&parts, &names(&["c"]), "c").is_empty());
    }

    #[test]
    fn the_commands_parse_with_the_etcd_flags_of_place() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: super::super::CtlArgs,
        }
        use super::super::CtlCommand;
        let parse =
            |argv: &[&str]| <Cli as clap::Parser>::try_parse_from(argv).map(|c| c.ctl.command);
        let etcd = ["--etcd", "http://e:2379", "--cluster", "c"];
        let with = |head: &[&str]| -> Vec<String> {
            ["ctl"]
                .iter()
                .chain(head)
                .chain(&etcd)
                .map(|s| s.to_string())
                .collect()
        };
        let argv = with(&["move", "jobs", "2", "--to", "b"]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert!(matches!(
            parse(&argv).unwrap(),
            CtlCommand::Move { tube, partition: 2, to, at } if tube == "jobs" && to == "b"
                && at.cluster.as_deref() == Some("c") && at.etcd == ["http://e:2379"]
        ));
        let argv = with(&["rebalance", "--by", "tasks", "--dry-run"]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert!(matches!(
            parse(&argv).unwrap(),
            CtlCommand::Rebalance {
                by: Balance::Tasks,
                dry_run: true,
                ..
            }
        ));
        let argv = with(&["rebalance"]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert!(matches!(
            parse(&argv).unwrap(),
            CtlCommand::Rebalance {
                by: Balance::Count,
                dry_run: false,
                ..
            }
        ));
        let argv = with(&["drain", "c"]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert!(matches!(
            parse(&argv).unwrap(),
            CtlCommand::Drain { set, dry_run: false, .. } if set == "c"
        ));
        assert!(parse(&[
            "ctl",
            "rebalance",
            "--by",
            "weight",
            "--etcd",
            "x",
            "--cluster",
            "c"
        ])
        .is_err());
    }

    #[test]
    fn only_refusals_the_server_says_will_pass_are_asked_again() {
        for passes in [
            "this node's view of the placement is stale (etcd not read lately): no change now",
            "partition at index 3 has just moved to replica set c: it serves it in 900 ms",
            "this node is moving partition 1 of tube jobs now: one move at a time",
        ] {
            assert!(passing(passes), "{passes}");
        }
        for final_ in [
            "no partition 9 of tube jobs is placed",
            "replica set zz has no primary now",
            "the move of partition 1 of tube jobs was given up: the new owner: full; it stays on \
             replica set a",
        ] {
            assert!(!passing(final_), "{final_}");
        }
    }

    #[test]
    fn a_report_reads_with_and_without_already() {
        let r: Report = serde_json::from_str(
            r#"{"tube":"jobs","partition":2,"from":"a","to":"c","tasks":1234,"ms":56}"#,
        )
        .unwrap();
        assert_eq!((r.tasks, r.ms, r.already), (1234, 56, false));
        let r: Report = serde_json::from_str(
            r#"{"tube":"jobs","partition":2,"from":"c","to":"c","tasks":0,"ms":0,"already":true}"#,
        )
        .unwrap();
        assert!(r.already);
    }
}
