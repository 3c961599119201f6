//! One run, start to verdict: the cluster is built in namespaces (three etcd members, a replica
//! set of tarq nodes, a host for the clients and one for the harness's own questions), the
//! clients start (with a dropper making and dropping tubes under racing puts: `drops`), the
//! schedule's faults are applied and healed one after another, then every fault is healed,
//! the clients stop, the queue is drained through a node, each node's statistics are recorded
//! once replication has caught up, and the history is checked and drawn. Everything the run made is under its output directory: `history.jsonl`,
//! `report.json`, `timeline.svg` and the processes' logs.
//!
//! The harness's own host (`ctl`) is never named in a partition, so the harness keeps seeing
//! every node whatever the clients see; it watches who leads and records each new term, since a
//! new primary frees what clients held under the old one.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rmpv::Value;
use tarq_client::{pack_args, Client};

use crate::checker::{self, Report};
use crate::drops::{self, DropSpec};
use crate::history::{self, Kind, Protocol, F, HARNESS};
use crate::lazyfs::LazyFs;
use crate::nemesis::{schedule, Fault, Step};
use crate::net::{Host, Net};
use crate::procs::{etcd_bin, faketime_lib, tarq_bin, Clocks, Etcd, Node, NodeConfig};
use crate::timeline;
use crate::workload::{self, json_of, task_of, ClientSpec, Recorder, Target};

/// The tube the IPROTO and beanstalk clients share (`fifottl`).
const TUBE: &str = "jobs";
/// The tube of keyed puts (`utubettl`): one task of a key at a time, in put order.
const KEYED: &str = "keyed";
/// Both tubes with their types.
const TUBES: [(&str, &str); 2] = [(TUBE, "fifottl"), (KEYED, "utubettl")];
/// utube keys the keyed clients spread their puts over.
const KEYS: u32 = 4;
/// Threads that put into each tube the dropper makes, racing its drop.
const DROP_RACERS: usize = 2;
/// Every node's beanstalk port.
const BEANSTALK_PORT: u16 = 11300;
/// How long a question to a node may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the harness asks who leads.
const WATCH_EVERY: Duration = Duration::from_millis(200);
/// How long the cluster may take to have a primary again once every fault is healed.
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);
/// How long the drain may take.
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// How long the replicas may take to agree with the primary at the end.
const AGREE_LIMIT: Duration = Duration::from_secs(30);

/// The flags every tarq node of a run gets unless told otherwise: one synchronous replica,
/// the shortest lease, and a WAL that survives a power loss.
pub const DEFAULT_TARQ_ARGS: [&str; 6] = [
    "--sync-replicas",
    "1",
    "--lease-ttl",
    "2",
    "--wal-mode",
    "fsync",
];

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// How long faults are scheduled for (the run takes longer: start, heal, drain).
    pub time: Duration,
    pub faults: Vec<Fault>,
    pub clients: usize,
    /// Nodes a replica set.
    pub nodes: usize,
    /// Replica sets: 1 is a plain cluster; more make a sharded one, whose tube has two
    /// partitions a set and whose partitions are moved between sets while the faults run.
    pub sets: usize,
    /// The ttr clients' puts ask for.
    pub ttr_secs: u64,
    /// Flags every tarq node gets besides its address, etcd and name.
    pub tarq_args: Vec<String>,
    /// Where the history, report, picture and logs go (created).
    pub out: PathBuf,
}

/// What a run needs that this machine lacks, each named with where to get it: root, `ip`,
/// `nft`, etcd and a built tarq. Empty when a run can start.
pub fn missing() -> Vec<String> {
    let mut missing = crate::net::missing();
    missing.extend(etcd_bin().err().map(|e| e.to_string()));
    missing.extend(tarq_bin().err().map(|e| e.to_string()));
    missing.extend(faketime_lib().err().map(|e| e.to_string()));
    let unshare = std::process::Command::new("unshare")
        .args(["--time", "--monotonic", "1", "true"])
        .status();
    if !unshare.is_ok_and(|s| s.success()) {
        missing.push("time namespaces (`unshare --time`, util-linux, Linux 5.6)".to_owned());
    }
    if !std::path::Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse (FUSE, for the power-loss fault's lazyfs)".to_owned());
    }
    missing
}

/// A node's role and term as it says (`queue.cluster()`), asked from `ctl`.
fn role_of(node: &Node, ctl: &Host) -> Option<(String, u64)> {
    let addr = node.addr();
    ctl.in_thread(|| ask_role(addr)).ok().flatten()
}

/// Node `i`'s clocks: a monotonic clock of its own at every start (offsets far apart, some
/// lower than the last start's, as after a reboot), and a wall clock the `clock-jump` fault
/// steps through the file `dir/wall-offset`.
fn clocks_of(dir: &std::path::Path, i: usize) -> Result<Clocks> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join("wall-offset");
    std::fs::write(&file, "+0")?;
    let base = 1_000 * (i as i64 + 1);
    Ok(Clocks {
        monotonic_offsets: vec![base, 5_000_000 + base, 10 + base, 90_000 + base],
        wall_offset_file: Some(file),
    })
}

/// Node `i`'s name: `n1`.. in a plain cluster, `a1`.., `b1`.. by replica set when sharded.
fn node_name(opts: &Options, i: usize) -> String {
    if opts.sets > 1 {
        let set = char::from(b'a' + (i / opts.nodes) as u8);
        format!("{set}{}", i % opts.nodes + 1)
    } else {
        format!("n{}", i + 1)
    }
}

struct World {
    nodes: Vec<Node>,
    /// Each node's data directory, a lazyfs mount (after `nodes`: the processes go first).
    disks: Vec<LazyFs>,
    /// Each node's replica set (an index into `set_names`).
    set_of: Vec<usize>,
    set_names: Vec<String>,
    etcd: Etcd,
    node_hosts: Vec<Host>,
    etcd_hosts: Vec<Host>,
    clients: Host,
    ctl: Host,
    rec: Arc<Recorder>,
    rng: fastrand::Rng,
    // Last: dropping it removes the namespaces, once the processes above are gone.
    net: Net,
}

/// What a fault left to undo.
enum Undo {
    /// It stays: a stepped clock is not stepped back.
    Nothing,
    Restart(Vec<usize>),
    Resume(usize),
    Network,
    RestartEtcd(usize),
    ResumeEtcd(usize),
}

impl World {
    fn build(opts: &Options, rec: Arc<Recorder>) -> Result<World> {
        let removed = Net::clean_stale()?;
        if !removed.is_empty() {
            eprintln!("removed what interrupted runs left: {}", removed.join(", "));
        }
        let run_id = format!("s{}", opts.seed % 1_000_000);
        let net = Net::create(&run_id)?;
        let etcd_hosts: Vec<Host> = (1..=3)
            .map(|i| net.add_host(&format!("e{i}")))
            .collect::<Result<_>>()?;
        let node_hosts: Vec<Host> = (0..opts.nodes * opts.sets)
            .map(|i| net.add_host(&node_name(opts, i)))
            .collect::<Result<_>>()?;
        let clients = net.add_host("clients")?;
        let ctl = net.add_host("ctl")?;
        let etcd_refs: Vec<&Host> = etcd_hosts.iter().collect();
        let etcd = Etcd::start(&etcd_bin()?, &etcd_refs, &opts.out.join("etcd"))?;
        let tarq = tarq_bin()?;
        let mut nodes = Vec::new();
        let mut disks = Vec::new();
        let set_of: Vec<usize> = (0..node_hosts.len()).map(|i| i / opts.nodes).collect();
        let set_names: Vec<String> = (0..opts.sets)
            .map(|s| char::from(b'a' + s as u8).to_string())
            .collect();
        for (i, host) in node_hosts.iter().enumerate() {
            let name = node_name(opts, i);
            let dir = opts.out.join(&name);
            let mut cfg =
                NodeConfig::new(&name, "chaos", &etcd.client_urls(), &dir).args(&opts.tarq_args);
            if opts.sets > 1 {
                cfg = cfg.args(&["--replica-set", &set_names[set_of[i]]]);
            }
            let beanstalk = host.sockaddr(BEANSTALK_PORT).to_string();
            cfg = cfg.args(&["--beanstalk-listen", &beanstalk]);
            cfg.clocks = clocks_of(&dir, i)?;
            // Mounted before the node starts: its namespace must see the mount.
            let backing = dir.join("disk");
            std::fs::create_dir_all(&backing)?;
            std::fs::create_dir_all(&cfg.data_dir)?;
            disks.push(LazyFs::mount(&backing, &cfg.data_dir)?);
            nodes.push(Node::start(&tarq, host, cfg)?);
        }
        Ok(World {
            nodes,
            disks,
            set_of,
            set_names,
            etcd,
            node_hosts,
            etcd_hosts,
            clients,
            ctl,
            rec,
            rng: fastrand::Rng::with_seed(opts.seed ^ 0x9e37_79b9_7f4a_7c15),
            net,
        })
    }

    /// The node of replica set `set` that says it leads with the highest term, if any does.
    fn primary(&self, set: usize) -> Option<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.set_of[i] == set)
            .filter_map(|i| {
                let (role, term) = role_of(&self.nodes[i], &self.ctl)?;
                (role == "leader").then_some((term, i))
            })
            .max()
            .map(|(_, i)| i)
    }

    /// Waits until every replica set has a primary; returns the first set's.
    fn wait_primaries(&self, limit: Duration) -> Result<usize> {
        let deadline = Instant::now() + limit;
        loop {
            let primaries: Option<Vec<usize>> =
                (0..self.set_names.len()).map(|s| self.primary(s)).collect();
            if let Some(p) = primaries {
                return Ok(p[0]);
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("--- {}\n{}", n.name(), n.log_tail(15)))
                    .collect();
                bail!(
                    "not every replica set had a primary within {limit:?}; the nodes' logs:\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(WATCH_EVERY);
        }
    }

    /// Runs `f` with a client of node `i` from the harness's host.
    fn ask<T: Send>(&self, i: usize, f: impl FnOnce(&mut Client) -> Result<T> + Send) -> Result<T> {
        let addr = self.nodes[i].addr();
        self.ctl.in_thread(|| {
            let mut c = Client::connect_addr(addr, Duration::from_secs(5))
                .with_context(|| format!("connect to {addr}"))?;
            f(&mut c)
        })?
    }

    /// The other members of `p`'s replica set.
    fn others(&self, p: usize) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| i != p && self.set_of[i] == self.set_of[p])
            .collect()
    }

    /// Every host but `ctl` and those of `except`.
    fn everyone_but(&self, except: &[&Host]) -> Vec<&Host> {
        self.node_hosts
            .iter()
            .chain(&self.etcd_hosts)
            .chain([&self.clients])
            .filter(|h| !except.contains(h))
            .collect()
    }

    /// Applies `fault`, holding it `hold`; returns what to undo and what it hit.
    fn apply(&mut self, fault: Fault, hold: Duration) -> Result<(Undo, serde_json::Value)> {
        let set = self.rng.usize(0..self.set_names.len());
        let members: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.set_of[i] == set)
            .collect();
        let p = self
            .primary(set)
            .unwrap_or_else(|| members[self.rng.usize(0..members.len())]);
        let ph = self.node_hosts[p].clone();
        let name = |w: &World, i: usize| w.nodes[i].name().to_owned();
        let mut target = serde_json::json!({"name": fault.name(), "primary": name(self, p)});
        let undo = match fault {
            Fault::KillPrimary => {
                self.nodes[p].kill()?;
                Undo::Restart(vec![p])
            }
            Fault::PausePrimary => {
                self.nodes[p].pause()?;
                Undo::Resume(p)
            }
            Fault::IsolatePrimary => {
                let rest = self.everyone_but(&[&ph]);
                self.net.partition(&[vec![&ph], rest])?;
                Undo::Network
            }
            Fault::PrimaryFromEtcd => {
                let etcd: Vec<&Host> = self.etcd_hosts.iter().collect();
                self.net.partition(&[vec![&ph], etcd])?;
                Undo::Network
            }
            Fault::PrimaryFromReplicas => {
                let replicas: Vec<&Host> = self
                    .others(p)
                    .iter()
                    .map(|&i| &self.node_hosts[i])
                    .collect();
                self.net.partition(&[vec![&ph], replicas])?;
                Undo::Network
            }
            Fault::MinorityPrimary => {
                let e1 = self.etcd_hosts[0].clone();
                let rest = self.everyone_but(&[&ph, &e1]);
                self.net.partition(&[vec![&ph, &e1], rest])?;
                Undo::Network
            }
            Fault::Bridge => {
                let r = self.others(p)[0];
                let rh = self.node_hosts[r].clone();
                self.net.cut(&ph, &rh)?;
                Undo::Network
            }
            Fault::LaggingReplica => return self.lagging_replica(p, hold, target),
            Fault::Loss => {
                let rest = self.everyone_but(&[&ph]);
                self.net.loss(&ph, &rest, 30)?;
                Undo::Network
            }
            Fault::KillEtcd => {
                let m = self.rng.usize(0..3);
                self.etcd.member_mut(m).kill()?;
                Undo::RestartEtcd(m)
            }
            Fault::PauseEtcd => {
                let m = self.rng.usize(0..3);
                self.etcd.member(m).pause()?;
                Undo::ResumeEtcd(m)
            }
            Fault::ClientsFromPrimary => {
                let clients = self.clients.clone();
                self.net.partition(&[vec![&ph], vec![&clients]])?;
                Undo::Network
            }
            Fault::PowerLoss => {
                let set = members;
                for &i in &set {
                    self.nodes[i].kill()?;
                }
                let mut lost = Vec::new();
                for &i in &set {
                    let l = self.disks[i].lose_unsynced()?;
                    lost.push(serde_json::json!({
                        "node": self.nodes[i].name(), "files": l.files, "names": l.names,
                    }));
                }
                target["lost_unsynced"] = lost.into();
                Undo::Restart(set)
            }
            Fault::Corrupt => {
                let others = self.others(p);
                let r = others[self.rng.usize(0..others.len())];
                self.nodes[r].kill()?;
                let damage = self.damage(r)?;
                target["replica"] = self.nodes[r].name().into();
                target["damage"] = damage.into();
                Undo::Restart(vec![r])
            }
            Fault::SetsApart => {
                let (inside, outside): (Vec<usize>, Vec<usize>) =
                    (0..self.nodes.len()).partition(|&i| self.set_of[i] == set);
                let inside: Vec<&Host> = inside.iter().map(|&i| &self.node_hosts[i]).collect();
                let outside: Vec<&Host> = outside.iter().map(|&i| &self.node_hosts[i]).collect();
                self.net.partition(&[inside, outside])?;
                target["set"] = self.set_names[set].clone().into();
                Undo::Network
            }
            Fault::ClockJump => {
                let step = self.step_wall_clock(p)?;
                target["step_secs"] = step.into();
                // A step forward ends holds early there: TTRs follow the wall clock.
                target["frees_holds"] = (step > 0).into();
                Undo::Nothing
            }
        };
        std::thread::sleep(hold);
        Ok((undo, target))
    }

    /// The KIP-966 case: a replica cut from the primary falls behind for half the hold; then
    /// the primary and the other replica die together, the network heals, and the lagging
    /// replica is alone with etcd for the other half. It must not lead.
    fn lagging_replica(
        &mut self,
        p: usize,
        hold: Duration,
        mut target: serde_json::Value,
    ) -> Result<(Undo, serde_json::Value)> {
        let others = self.others(p);
        let Some((&lagging, rest)) = others.split_first() else {
            bail!("lagging-replica needs a primary and two replicas");
        };
        let (ph, lh) = (self.node_hosts[p].clone(), self.node_hosts[lagging].clone());
        self.net.cut(&ph, &lh)?;
        std::thread::sleep(hold / 2);
        let mut killed = vec![p];
        killed.extend_from_slice(rest);
        for &i in &killed {
            self.nodes[i].kill()?;
        }
        self.net.heal()?;
        target["lagging"] = self.nodes[lagging].name().into();
        std::thread::sleep(hold / 2);
        Ok((Undo::Restart(killed), target))
    }

    /// Damages node `r`'s newest snapshot or WAL segment (it is down): flips a byte in the
    /// middle, or cuts a segment in half; says what it did. Written through the node's mount
    /// and synced, so a later power loss does not undo it.
    fn damage(&mut self, r: usize) -> Result<String> {
        let dir = self.nodes[r].data_dir().to_path_buf();
        let newest = |suffix: &str| -> Option<PathBuf> {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.to_string_lossy().ends_with(suffix))
                .collect();
            files.sort();
            files.pop()
        };
        let snapshot = newest(".snap");
        let Some(segment) = newest(".xlog") else {
            return Ok("no WAL segment yet: nothing damaged".into());
        };
        let (file, cut) = match (self.rng.u32(0..3), snapshot) {
            (0, Some(snap)) => (snap, false),
            (1, _) => (segment, true),
            _ => (segment, false),
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)?;
        let len = f.metadata()?.len();
        let what = if cut {
            f.set_len(len / 2)?;
            format!("{} cut from {len} to {} bytes", file.display(), len / 2)
        } else {
            use std::os::unix::fs::FileExt;
            let at = len / 2;
            let mut byte = [0u8; 1];
            f.read_exact_at(&mut byte, at)?;
            f.write_all_at(&[byte[0] ^ 0x10], at)?;
            format!("{}: a bit flipped at offset {at} of {len}", file.display())
        };
        f.sync_all()?;
        Ok(what)
    }

    /// Steps node `p`'s wall clock by -120 to +120 s (never 0) from where it is; the step.
    fn step_wall_clock(&mut self, p: usize) -> Result<i64> {
        let file = self.nodes[p]
            .config()
            .clocks
            .wall_offset_file
            .clone()
            .context("the node's wall clock is the machine's")?;
        let now: i64 = std::fs::read_to_string(&file)?.trim().parse().unwrap_or(0);
        let mut step = self.rng.i64(-120..=120);
        if step == 0 {
            step = 1;
        }
        std::fs::write(&file, format!("{:+}", now + step))?;
        Ok(step)
    }

    fn undo(&mut self, undo: Undo) -> Result<()> {
        match undo {
            Undo::Nothing => {}
            Undo::Restart(nodes) => {
                for i in nodes {
                    self.nodes[i].restart()?;
                }
            }
            Undo::Resume(i) => self.nodes[i].resume()?,
            Undo::Network => self.net.heal()?,
            Undo::RestartEtcd(m) => self.etcd.member_mut(m).restart()?,
            Undo::ResumeEtcd(m) => self.etcd.member(m).resume()?,
        }
        Ok(())
    }

    fn targets(&self) -> Vec<Target> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Target {
                name: n.name().to_owned(),
                addr: n.addr(),
                set: self.set_names[self.set_of[i]].clone(),
                beanstalk: Some(self.node_hosts[i].sockaddr(BEANSTALK_PORT)),
            })
            .collect()
    }
}

/// Records every new leadership term of each replica set the harness sees among `nodes`,
/// until `stop`. A term is seen up to a round of asking late: each event says since when it
/// may have begun (`since_us`, the start of the round before the one that saw it: a term
/// already leading then would have been seen then).
fn watch_leaders(nodes: &[Target], ctl: &Host, rec: &Recorder, stop: &AtomicBool) {
    ctl.enter_current_thread()
        .expect("enter the harness's namespace");
    let mut last_term: std::collections::HashMap<&str, u64> = Default::default();
    let mut since = 0;
    while !stop.load(Ordering::Relaxed) {
        let round = rec.now_us();
        for node in nodes {
            let Some((role, term)) = ask_role(node.addr) else {
                continue;
            };
            let last = last_term.entry(node.set.as_str()).or_default();
            if role == "leader" && term > *last {
                *last = term;
                let mut e = rec.event(HARNESS, Kind::Ok, F::Leader);
                e.node = Some(node.name.clone());
                let seen = serde_json::json!({ "term": term, "set": node.set, "since_us": since });
                e.value = Some(seen);
                rec.record(&e);
            }
        }
        since = round;
        std::thread::sleep(WATCH_EVERY);
    }
}

/// `queue.cluster()`'s role and term of the node at `addr`, asked from this thread's namespace.
fn ask_role(addr: std::net::SocketAddr) -> Option<(String, u64)> {
    let mut c = Client::connect_addr(addr, ASK_TIMEOUT).ok()?;
    let v = c.call("queue.cluster", &pack_args(&[]), None).ok()?;
    let o = json_of(v.first()?);
    Some((o["role"].as_str()?.to_owned(), o["term"].as_u64()?))
}

/// Runs the whole thing: returns the checker's report (also written to `report.json`).
pub fn run(opts: &Options) -> Result<Report> {
    crate::lazyfs::unmount_stale(&opts.out)?;
    let used = std::fs::read_dir(&opts.out).is_ok_and(|mut d| d.next().is_some());
    if used {
        bail!(
            "{} is not empty: a run writes into a directory of its own",
            opts.out.display()
        );
    }
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("cannot create {}", opts.out.display()))?;
    let history_path = opts.out.join("history.jsonl");
    let rec = Arc::new(Recorder::create(&history_path, Instant::now())?);
    let mut world = World::build(opts, Arc::clone(&rec))?;
    let p = world.wait_primaries(RECOVERY_LIMIT)?;
    create_tubes(&world, p, opts)?;

    let faults: Vec<Fault> = (opts.faults.iter().copied())
        .filter(|f| f.applies_to(opts.sets))
        .collect();
    let steps = schedule(opts.seed, &faults, opts.time);
    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients(&world, opts, &stop)?;
    let dropping = DropSpec {
        first_process: drops_process(opts),
        racers: DROP_RACERS,
        targets: world.targets(),
        host: world.clients.clone(),
        seed: opts.seed,
        partitions: (opts.sets > 1).then(|| partitions(opts)),
    };
    let drops::Dropping { dropper, racers } =
        drops::spawn(dropping, Arc::clone(&rec), Arc::clone(&stop))?;
    let watcher = {
        let (nodes, ctl, rec, stop) = (
            world.targets(),
            world.ctl.clone(),
            Arc::clone(&rec),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || watch_leaders(&nodes, &ctl, &rec, &stop))
    };
    let mover = (opts.sets > 1).then(|| {
        let (nodes, ctl, rec, stop) = (
            world.targets(),
            world.ctl.clone(),
            Arc::clone(&rec),
            Arc::clone(&stop),
        );
        let (seed, partitions) = (opts.seed, partitions(opts));
        std::thread::spawn(move || move_partitions(&nodes, &ctl, &rec, &stop, seed, partitions))
    });
    let faulted = run_schedule(&mut world, &steps);
    stop.store(true, Ordering::Relaxed);
    for c in clients.into_iter().chain(racers) {
        c.join()
            .map_err(|_| anyhow::anyhow!("a client thread panicked"))?;
    }
    let left = dropper
        .join()
        .map_err(|_| anyhow::anyhow!("the dropper panicked"))?;
    watcher
        .join()
        .map_err(|_| anyhow::anyhow!("the leader watcher panicked"))?;
    if let Some(mover) = mover {
        mover
            .join()
            .map_err(|_| anyhow::anyhow!("the mover panicked"))?;
    }
    faulted?;

    // A set that lost what it acknowledged (every member's log behind the committed position)
    // stays without a primary by design: the run goes on to the verdict, which counts what
    // could not be drained as lost, instead of failing without one.
    match world.wait_primaries(RECOVERY_LIMIT) {
        Ok(p) => {
            // The tubes the dropper did not see dropped are drained too, unless they are
            // gone (an earlier drop of unknown outcome was made).
            let process = drops_process(opts);
            let live = settle_left(&world, process, left)?;
            for (k, (tube, _)) in TUBES.into_iter().enumerate() {
                // Each call a drain has in flight is its own process (one open operation each).
                drain(
                    &world,
                    p,
                    (opts.clients + k * DRAIN_WINDOW) as u64,
                    tube,
                    None,
                )?;
            }
            // One after another, through one range of processes after the racers'.
            let first = process + 1 + DROP_RACERS as u64;
            for tube in &live {
                drain(&world, p, first, tube, Some(process))?;
            }
            record_stats(&world)?;
        }
        Err(e) => {
            eprintln!("no drain: {e:#}");
            let mut note = rec.event(HARNESS, Kind::Invoke, F::Nemesis);
            let why = format!("{e:#}");
            note.value =
                Some(serde_json::json!({ "name": "no primary after healing", "why": why }));
            rec.record(&note);
            note.kind = Kind::Ok;
            note.time_us = rec.now_us();
            rec.record(&note);
        }
    }
    rec.flush()?;

    let file = std::fs::File::open(&history_path)?;
    let events = history::read(std::io::BufReader::new(file))?;
    let report = checker::check(&events);
    std::fs::write(
        opts.out.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    timeline::draw(&events, &opts.out.join("timeline.svg"))?;
    Ok(report)
}

/// Applies the schedule's faults one after another, each healed before the next; the
/// history gets each fault's start and healing.
fn run_schedule(world: &mut World, steps: &[Step]) -> Result<()> {
    for step in steps {
        let mut e = world.rec.event(HARNESS, Kind::Invoke, F::Nemesis);
        e.value = Some(serde_json::json!({ "name": step.fault.name() }));
        world.rec.record(&e);
        let (undo, mut target) = world.apply(step.fault, step.hold)?;
        world.undo(undo)?;
        if target.get("frees_holds").is_none() {
            target["frees_holds"] = step.fault.frees_holds().into();
        }
        let mut e = world.rec.event(HARNESS, Kind::Ok, F::Nemesis);
        e.node = target["primary"].as_str().map(str::to_owned);
        e.value = Some(target);
        world.rec.record(&e);
        std::thread::sleep(step.quiet);
    }
    Ok(())
}

/// The dropper's process (its racers' follow it): after the clients' and the drains'.
fn drops_process(opts: &Options) -> u64 {
    (opts.clients + TUBES.len() * DRAIN_WINDOW) as u64
}

/// The tube's partitions: two a replica set when sharded.
fn partitions(opts: &Options) -> u16 {
    if opts.sets > 1 {
        2 * opts.sets as u16
    } else {
        1
    }
}

/// Creates the tubes through `p` and waits until every node serves them.
fn create_tubes(world: &World, p: usize, opts: &Options) -> Result<()> {
    for (tube, kind) in TUBES {
        let mut args = vec![Value::from(tube), Value::from(kind)];
        if opts.sets > 1 {
            let n = partitions(opts);
            args.push(Value::Map(vec![(
                Value::from("partitions"),
                Value::from(n),
            )]));
        }
        world.ask(p, |c| {
            c.call("queue.create_tube", &pack_args(&args), None)
                .with_context(|| format!("queue.create_tube {tube}"))?;
            Ok(())
        })?;
    }
    let deadline = Instant::now() + RECOVERY_LIMIT;
    for i in 0..world.nodes.len() {
        for (tube, _) in TUBES {
            while world.ask(i, |c| tasks_of(c, tube)).is_err() {
                if Instant::now() > deadline {
                    bail!("node {} does not serve tube {tube}", world.nodes[i].name());
                }
                std::thread::sleep(WATCH_EVERY);
            }
        }
    }
    Ok(())
}

/// Moves a random partition to a random other set every few seconds, until `stop`: asked of
/// every node in turn, since only the owner's primary takes it. Each move is a fault in the
/// history (`move`) with its outcome; a refused or failed move is part of the test too.
fn move_partitions(
    nodes: &[Target],
    ctl: &Host,
    rec: &Recorder,
    stop: &AtomicBool,
    seed: u64,
    partitions: u16,
) {
    ctl.enter_current_thread()
        .expect("enter the harness's namespace");
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x6d6f_7665);
    let mut sets: Vec<&str> = nodes.iter().map(|n| n.set.as_str()).collect();
    sets.dedup();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.u64(2_000..6_000)));
        let partition = rng.u16(0..partitions);
        let to = sets[rng.usize(0..sets.len())];
        let mut e = rec.event(HARNESS, Kind::Invoke, F::Nemesis);
        e.value = Some(serde_json::json!({ "name": "move" }));
        rec.record(&e);
        let args = pack_args(&[Value::from(TUBE), Value::from(partition), Value::from(to)]);
        let mut outcome = String::from("no node answered");
        for node in nodes {
            let Ok(mut c) = Client::connect_addr(node.addr, ASK_TIMEOUT) else {
                continue;
            };
            match c.call("tarq.move", &args, Some(Duration::from_secs(30))) {
                Ok(_) => {
                    outcome = format!("moved by {}", node.name);
                    break;
                }
                Err(e) => outcome = format!("{}: {e}", node.name),
            }
        }
        let mut e = rec.event(HARNESS, Kind::Ok, F::Nemesis);
        e.value = Some(serde_json::json!({
            "name": "move", "partition": partition, "to": to, "outcome": outcome,
            "frees_holds": false,
        }));
        rec.record(&e);
    }
}

fn start_clients(
    world: &World,
    opts: &Options,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<()>>> {
    (0..opts.clients)
        .map(|i| {
            // Of every four clients: two on the tube API, one with utube keys, one on beanstalk.
            let (tube, keys, protocol) = match i % 4 {
                2 => (KEYED, KEYS, Protocol::Iproto),
                3 => (TUBE, 0, Protocol::Beanstalk),
                _ => (TUBE, 0, Protocol::Iproto),
            };
            let spec = ClientSpec {
                process: i as u64,
                tube: tube.to_owned(),
                targets: world.targets(),
                host: world.clients.clone(),
                seed: opts.seed.wrapping_add(i as u64 + 1),
                ttr_secs: opts.ttr_secs,
                keys,
                protocol,
            };
            workload::spawn(spec, Arc::clone(&world.rec), Arc::clone(stop))
        })
        .collect()
}

/// Kicks, takes and acks everything left in `tube`, through node `p`, recorded as process
/// `process`; done when the tube holds no task at all (ready, taken, delayed or buried). A
/// tube the dropper left (`dropper`: its process) may turn out gone once the drain's calls
/// name no tube (a drop of unknown outcome removed it, and a node's answer to the look before
/// the drain was lost): then that is recorded as the dropper's, and the drain is done.
fn drain(world: &World, p: usize, process: u64, tube: &str, dropper: Option<u64>) -> Result<()> {
    // The limit is on a drain that makes no progress: a long run leaves a long backlog.
    let mut deadline = Instant::now() + DRAIN_LIMIT;
    let mut p = p;
    loop {
        let rec = Arc::clone(&world.rec);
        let node = world.nodes[p].name().to_owned();
        let at = &mut deadline;
        let emptied = world.ask(p, move |c| drain_session(c, &rec, &node, process, tube, at))?;
        if emptied {
            return Ok(());
        }
        if let Some(dropper) = dropper {
            if settle_left(world, dropper, vec![tube.to_owned()])?.is_empty() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("the drain of tube {tube} took nothing for {DRAIN_LIMIT:?}");
        }
        // The connection was lost (a late election, a node that closed its clients): the
        // drain goes on through whichever node leads now, as a client would.
        p = world.wait_primaries(RECOVERY_LIMIT)?;
    }
}

/// The tubes of `left` still on some node; those gone from every node the dropper (process
/// `dropper`) records so (`drops::settle_left`, run from the clients' namespace).
fn settle_left(world: &World, dropper: u64, left: Vec<String>) -> Result<Vec<String>> {
    let (targets, host, rec) = (
        world.targets(),
        world.clients.clone(),
        Arc::clone(&world.rec),
    );
    std::thread::spawn(move || drops::settle_left(&targets, &host, rec, dropper, &left))
        .join()
        .map_err(|_| anyhow::anyhow!("sorting the dropper's tubes panicked"))?
}

/// Calls a drain keeps in flight: one at a time, each waits for the sync quorum and etcd's
/// record of the committed position (tens of ms on a loaded machine), and a 30-minute run
/// leaves a backlog of 100k tasks and more; sent together, a round of acknowledgements covers
/// them all.
const DRAIN_WINDOW: usize = 64;

/// One session of the drain on `c`: true once the tube is empty (an error past `deadline`,
/// which each task taken moves on by `DRAIN_LIMIT`),
/// false when the connection was lost (the open operations and the session's end are recorded
/// as a client's would be). Takes go `DRAIN_WINDOW` at a time, then the acks of what they
/// took.
fn drain_session(
    c: &mut Client,
    rec: &Recorder,
    node: &str,
    process: u64,
    tube: &str,
    deadline: &mut Instant,
) -> Result<bool> {
    let session = rec.next_session();
    let take = format!("queue.tube.{tube}:take");
    let ack = format!("queue.tube.{tube}:ack");
    let kick = format!("queue.tube.{tube}:kick");
    // The call in slot `j` of the window is process `process + j`.
    let event = |j: usize, f: F, id: Option<u64>, payload: Option<String>| {
        let mut e = rec.event(process + j as u64, Kind::Invoke, f);
        (e.node, e.session, e.tube) = (Some(node.to_owned()), Some(session), Some(tube.into()));
        (e.protocol, e.id, e.payload) = (Some(Protocol::Iproto), id, payload);
        e
    };
    // A round's takes wait a moment only after a round that took nothing: a utube tube gives
    // one task a key at a time, and takes that all wait would make each round that long.
    let mut wait = 0.2;
    loop {
        let takes = (0..DRAIN_WINDOW)
            .map(|j| {
                (
                    event(j, F::Take, None, None),
                    pack_args(&[Value::from(wait)]),
                )
            })
            .collect();
        let Some(took) = pipelined(c, rec, &take, takes, node, process, session) else {
            return Ok(false);
        };
        let mut acks = Vec::new();
        for (mut e, got) in took {
            e.kind = Kind::Ok;
            e.time_us = rec.now_us();
            let task = task_of(&got);
            if let Some((id, payload)) = &task {
                (e.id, e.payload) = (Some(*id), payload.clone());
                let a = event(acks.len(), F::Ack, Some(*id), payload.clone());
                acks.push((a, pack_args(&[Value::from(*id)])));
            }
            rec.record(&e);
        }
        wait = if acks.is_empty() { 0.2 } else { 0.0 };
        if !acks.is_empty() {
            *deadline = Instant::now() + DRAIN_LIMIT;
            let Some(acked) = pipelined(c, rec, &ack, acks, node, process, session) else {
                return Ok(false);
            };
            for (mut a, _) in acked {
                a.kind = Kind::Ok;
                a.time_us = rec.now_us();
                rec.record(&a);
            }
            continue;
        }
        // Nothing ready: what the clients buried is kicked out (not recorded: a kick delivers
        // nothing; the takes that follow record what it made ready).
        // Neither is recorded: one that fails (a set without a primary for a moment, a lost
        // connection) ends the session, and the drain goes on through whichever node leads.
        match kicked(c, &kick) {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => return drain_interrupted(rec, node, process, session, &e),
        }
        match tube_is_empty(c, tube) {
            Ok(true) => return Ok(true),
            Ok(false) => {}
            Err(e) => return drain_interrupted(rec, node, process, session, &e),
        }
        if Instant::now() > *deadline {
            bail!("the drain of tube {tube} took nothing for {DRAIN_LIMIT:?}");
        }
    }
}

/// The drain's session ends on a failed kick or statistics call (nothing of it open): its end
/// is recorded, and the caller goes on through whichever node leads (`Ok(false)`).
fn drain_interrupted(
    rec: &Recorder,
    node: &str,
    process: u64,
    session: u64,
    why: &anyhow::Error,
) -> Result<bool> {
    let mut d = rec.event(process, Kind::Info, F::Disconnect);
    (d.session, d.node, d.error) = (
        Some(session),
        Some(node.to_owned()),
        Some(format!("{why:#}")),
    );
    rec.record(&d);
    Ok(false)
}

/// Sends every call (its invoke recorded first) on `c` and waits for all their replies: each
/// call's event with its reply's values, in the order sent. A reply that is an error ends the
/// session as a lost connection does: `None`, with every call not answered OK recorded as
/// unknown (`info`) and the session's end.
fn pipelined(
    c: &mut Client,
    rec: &Recorder,
    function: &str,
    calls: Vec<(history::Event, Vec<u8>)>,
    node: &str,
    process: u64,
    session: u64,
) -> Option<Vec<(history::Event, Vec<Value>)>> {
    let mut open: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut events = Vec::with_capacity(calls.len());
    let mut failure = None;
    for (e, args) in calls {
        rec.record(&e);
        let sent = c.send_request(|o, s| tarq_iproto::client::call(o, s, function, &args));
        events.push((e, None));
        match sent {
            Ok(sync) => {
                open.insert(sync, events.len() - 1);
            }
            Err(why) => {
                failure = Some(why.to_string());
                break;
            }
        }
    }
    while failure.is_none() && !open.is_empty() {
        let reply = match c.recv_within(Duration::from_secs(10)) {
            Ok(Some(r)) => r,
            Ok(None) => {
                failure = Some("the server closed the connection".into());
                break;
            }
            Err(why) => {
                failure = Some(why.to_string());
                break;
            }
        };
        let Some(at) = open.remove(&reply.sync) else {
            continue;
        };
        match reply.into_result().and_then(|r| r.values()) {
            Ok(values) => events[at].1 = Some(values),
            Err(why) => {
                failure = Some(why.to_string());
                break;
            }
        }
    }
    let Some(why) = failure else {
        return Some(
            events
                .into_iter()
                .map(|(e, v)| (e, v.unwrap_or_default()))
                .collect(),
        );
    };
    // What was answered OK is recorded so; the rest may or may not have happened.
    for (mut e, values) in events {
        e.time_us = rec.now_us();
        match values {
            Some(values) => {
                e.kind = Kind::Ok;
                if let Some((id, payload)) = task_of(&values) {
                    (e.id, e.payload) = (Some(id), payload);
                }
            }
            None => (e.kind, e.error) = (Kind::Info, Some(why.clone())),
        }
        rec.record(&e);
    }
    let mut d = rec.event(process, Kind::Info, F::Disconnect);
    (d.session, d.node, d.error) = (Some(session), Some(node.to_owned()), Some(why));
    rec.record(&d);
    None
}

/// Kicks every buried task of the tube `kick` names; whether there was one.
fn kicked(c: &mut Client, kick: &str) -> Result<bool> {
    let v = c
        .call(kick, &pack_args(&[Value::from(u32::MAX)]), None)
        .context("a kick of the drain")?;
    Ok(v.first().and_then(Value::as_u64).unwrap_or(0) > 0)
}

/// The `tasks` figures of `tube`, as node `c` says.
fn tasks_of(c: &mut Client, tube: &str) -> Result<serde_json::Value> {
    let v = c
        .call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
        .context("queue.statistics")?;
    let stats = v.first().map(json_of).unwrap_or_default();
    Ok(stats["tasks"].clone())
}

fn tube_is_empty(c: &mut Client, tube: &str) -> Result<bool> {
    let tasks = tasks_of(c, tube)?;
    Ok(["ready", "taken", "delayed", "buried"]
        .iter()
        .all(|k| tasks[k].as_u64() == Some(0)))
}

/// Records every node's statistics once they all agree on the tube's task counts (or the
/// limit passed: then as they are, and the checker says they differ).
fn record_stats(world: &World) -> Result<()> {
    let deadline = Instant::now() + AGREE_LIMIT;
    loop {
        // The tube's figures (the whole tube's, on a sharded node), keyed by the tube.
        let all: Vec<serde_json::Value> = (0..world.nodes.len())
            .map(|i| {
                world.ask(i, |c| {
                    let mut by_tube = serde_json::Map::new();
                    for (tube, _) in TUBES {
                        let v = c
                            .call("queue.statistics", &pack_args(&[Value::from(tube)]), None)
                            .context("queue.statistics")?;
                        by_tube.insert(tube.into(), v.first().map(json_of).unwrap_or_default());
                    }
                    Ok(serde_json::Value::Object(by_tube))
                })
            })
            .collect::<Result<_>>()?;
        let agree = all.windows(2).all(|w| {
            TUBES
                .iter()
                .all(|(t, _)| w[0][t]["tasks"] == w[1][t]["tasks"])
        });
        if agree || Instant::now() > deadline {
            for (i, stats) in all.into_iter().enumerate() {
                let mut e = world.rec.event(HARNESS, Kind::Ok, F::Stats);
                e.node = Some(world.nodes[i].name().to_owned());
                e.value = Some(stats);
                world.rec.record(&e);
            }
            return Ok(());
        }
        std::thread::sleep(WATCH_EVERY);
    }
}
