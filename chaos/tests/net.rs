//! The harness's network and processes for real: namespaces on a bridge, nftables faults in
//! them (partition, pairwise cut, loss, heal; a connection opened before the fault loses its
//! packets too), the removal of what a dead run left, and etcd and tarq started in hosts (a
//! node that leads, survives `kill -9` and a restart, and answers nothing while paused).
//!
//! They need root, `ip` and `nft` (and `etcd` and a built `tarq` for the process tests).
//! Missing any, a test prints `SKIPPED: <test>: <what to install>` and passes, unless `CI=true`,
//! where it fails saying the same (tarq-testkit's rule for what a test needs). Every wait polls
//! a condition with a deadline; every `Net` removes its namespaces on drop, failed test or not.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tarq_chaos::net::{Host, Net};
use tarq_chaos::procs::{etcd_bin, tarq_bin, Etcd, Node, NodeConfig};
use tarq_client::{cluster::map_get, pack_args};
use tarq_testkit::reference::{ci, skip};

/// The longest any condition is waited for.
const WAIT: Duration = Duration::from_secs(30);
/// How long a connect may take before a host counts as unreachable: the bridge answers in
/// microseconds, so a reachable host never comes near it.
const BLOCKED_AFTER: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------------------------
// What the tests need

/// What a test needs besides root, `ip` and `nft`.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    None,
    /// etcd and the tarq binary.
    Processes,
}

/// The test's network (its namespaces named after `run`), or `None` when something it needs
/// is missing: skipped outside CI, a failure under `CI=true`.
fn setup(run: &str, extra: Extra) -> Option<Net> {
    let mut missing = tarq_chaos::net::missing();
    if extra == Extra::Processes {
        missing.extend(etcd_bin().err().map(|e| e.to_string()));
        missing.extend(tarq_bin().err().map(|e| e.to_string()));
    }
    if missing.is_empty() {
        match Net::create(run) {
            Ok(net) => return Some(net),
            Err(e) => missing.push(format!("network namespaces that work ({e:#})")),
        }
    }
    let why = format!("needs {}", missing.join("; "));
    if ci() {
        panic!("{why}\n(CI=true: nothing may be skipped)");
    }
    skip(&why);
    None
}

// ---------------------------------------------------------------------------------------------
// Probes

/// Waits until `cond` holds, polling, failing after [`WAIT`] naming `what`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection from `from` to `to`, or the connect's error.
fn connect(from: &Host, to: SocketAddr) -> std::io::Result<TcpStream> {
    from.in_thread(|| TcpStream::connect_timeout(&to, BLOCKED_AFTER))
        .expect("enter the namespace")
}

fn reaches(from: &Host, to: SocketAddr) -> bool {
    connect(from, to).is_ok()
}

/// `from` cannot connect to `to` because nothing comes back: the connect times out (a refusal
/// would mean packets got through).
fn assert_blocked(from: &Host, to: SocketAddr) {
    match connect(from, to) {
        Err(e) if e.kind() == ErrorKind::TimedOut => {}
        Err(e) => panic!("{} to {to}: expected a timeout, got {e}", from.name()),
        Ok(_) => panic!("{} still reaches {to}", from.name()),
    }
}

/// A TCP echo server on a host's address: every connection gets back what it sends. Stopped
/// on drop (shutting its listening socket down ends the blocked accept).
struct Echo {
    addr: SocketAddr,
    listener: TcpListener,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(host: &Host) -> Echo {
        let listener = host
            .in_thread(|| TcpListener::bind(host.sockaddr(0)))
            .expect("enter the namespace")
            .expect("bind the echo server");
        let addr = listener.local_addr().unwrap();
        let accepting = listener.try_clone().unwrap();
        let thread = std::thread::spawn(move || {
            for conn in accepting.incoming() {
                let Ok(conn) = conn else { break };
                std::thread::spawn(move || echo(conn));
            }
        });
        Echo {
            addr,
            listener,
            thread: Some(thread),
        }
    }
}

/// Copies a connection back to itself until it closes or stays silent for a minute.
fn echo(mut conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut back = conn.try_clone().expect("clone the connection");
    let _ = std::io::copy(&mut conn, &mut back);
}

impl Drop for Echo {
    fn drop(&mut self) {
        // SAFETY: shutdown on a descriptor `self.listener` owns; it wakes the accept with an
        // error, which ends the accepting thread.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends `msg` and reads it back within `within`; the read's error when it does not come.
fn round_trip(conn: &mut TcpStream, msg: &[u8], within: Duration) -> std::io::Result<()> {
    conn.write_all(msg)?;
    read_back(conn, msg, within)
}

fn read_back(conn: &mut TcpStream, msg: &[u8], within: Duration) -> std::io::Result<()> {
    conn.set_read_timeout(Some(within))?;
    let mut got = vec![0; msg.len()];
    conn.read_exact(&mut got)?;
    assert_eq!(got, msg, "the echo sent back something else");
    Ok(())
}

fn add_hosts(net: &Net, names: &[&str]) -> Vec<Host> {
    names
        .iter()
        .map(|n| net.add_host(n).expect("add a host"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The network

#[test]
fn partition_stops_new_and_established_connections_and_heal_restores_them() {
    let Some(net) = setup("partition", Extra::None) else {
        return;
    };
    let [a, b, c] = <[Host; 3]>::try_from(add_hosts(&net, &["a", "b", "c"])).unwrap();
    let echo_b = Echo::start(&b);
    let echo_a = Echo::start(&a);
    wait_until("a to reach b over the bridge", || reaches(&a, echo_b.addr));
    let mut established = connect(&a, echo_b.addr).unwrap();
    round_trip(&mut established, b"before", WAIT).unwrap();

    net.partition(&[vec![&a], vec![&b]]).unwrap();
    assert_blocked(&a, echo_b.addr);
    assert_blocked(&b, echo_a.addr);
    // The open connection gets nothing back either: the drop is by address, not by state.
    let lost = round_trip(&mut established, b"during", Duration::from_millis(500));
    let kind = lost.expect_err("data crossed the partition").kind();
    assert!(
        matches!(kind, ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{kind:?}"
    );
    // c is in no group: it reaches both sides.
    assert!(reaches(&c, echo_a.addr) && reaches(&c, echo_b.addr));

    net.heal().unwrap();
    assert!(reaches(&a, echo_b.addr) && reaches(&b, echo_a.addr));
    // TCP retransmits what the partition dropped: the same connection gets its echo.
    read_back(&mut established, b"during", WAIT).unwrap();
}

#[test]
fn cut_is_pairwise_and_not_transitive() {
    let Some(net) = setup("cut", Extra::None) else {
        return;
    };
    let hosts = add_hosts(&net, &["a", "b", "c"]);
    let echoes: Vec<Echo> = hosts.iter().map(Echo::start).collect();
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    wait_until("every host to reach every other", || {
        hosts
            .iter()
            .all(|h| echoes.iter().all(|e| reaches(h, e.addr)))
    });

    net.cut(a, c).unwrap();
    assert!(reaches(a, echoes[1].addr), "a–b stays up");
    assert!(reaches(b, echoes[2].addr), "b–c stays up");
    assert!(reaches(b, echoes[0].addr), "b–a stays up");
    assert_blocked(a, echoes[2].addr);
    assert_blocked(c, echoes[0].addr);

    // Cuts add up: with b–c cut too, b reaches only a.
    net.cut(b, c).unwrap();
    assert!(reaches(b, echoes[0].addr));
    assert_blocked(b, echoes[2].addr);

    net.heal().unwrap();
    assert!(reaches(a, echoes[2].addr) && reaches(b, echoes[2].addr));
}

#[test]
fn loss_of_100_percent_drops_everything_between_the_host_and_its_peers() {
    let Some(net) = setup("loss", Extra::None) else {
        return;
    };
    let hosts = add_hosts(&net, &["a", "b", "c"]);
    let echoes: Vec<Echo> = hosts.iter().map(Echo::start).collect();
    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    wait_until("a to reach b and c", || {
        reaches(a, echoes[1].addr) && reaches(a, echoes[2].addr)
    });

    net.loss(a, &[b], 100).unwrap();
    assert_blocked(a, echoes[1].addr);
    assert_blocked(b, echoes[0].addr);
    assert!(reaches(a, echoes[2].addr), "c is not a peer of the loss");
    // A partial loss is accepted by nftables (its effect is random; 100% is the checkable one).
    net.loss(c, &[b], 30).unwrap();
    assert!(net.loss(c, &[b], 101).is_err());

    net.heal().unwrap();
    assert!(reaches(a, echoes[1].addr) && reaches(b, echoes[0].addr));
}

#[test]
fn a_thread_enters_a_host_and_only_that_thread_moves() {
    let Some(net) = setup("enter", Extra::None) else {
        return;
    };
    let hosts = add_hosts(&net, &["a", "b"]);
    let echo_b = Echo::start(&hosts[1]);
    let a = hosts[0].clone();
    let to = echo_b.addr;
    let entered = std::thread::spawn(move || {
        a.enter_current_thread().unwrap();
        // The address is a's, so it can be bound here...
        TcpListener::bind(a.sockaddr(0)).expect("bind a's address inside a");
        let deadline = Instant::now() + WAIT;
        loop {
            match TcpStream::connect_timeout(&to, BLOCKED_AFTER) {
                Ok(s) => return s,
                Err(e) => assert!(Instant::now() < deadline, "a never reached b: {e}"),
            }
        }
    });
    let mut conn = entered.join().unwrap();
    // ...but not on this thread, still in the root namespace, where the subnet does not exist.
    assert!(TcpListener::bind(hosts[0].sockaddr(0)).is_err());
    // The socket stays a's whichever thread uses it.
    round_trip(&mut conn, b"hello", WAIT).unwrap();
}

/// Namespaces made by hand for the stale-cleaning test, deleted on drop if still there.
struct HandMade(Vec<String>);

impl HandMade {
    fn add(&mut self, ns: String) -> String {
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {ns}");
        self.0.push(ns.clone());
        ns
    }
}

impl Drop for HandMade {
    fn drop(&mut self) {
        for ns in &self.0 {
            if exists(ns) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", ns])
                    .status();
            }
        }
    }
}

fn exists(ns: &str) -> bool {
    PathBuf::from("/run/netns").join(ns).exists()
}

#[test]
fn clean_stale_removes_a_dead_runs_namespaces_and_leaves_live_ones() {
    let Some(net) = setup("stale", Extra::None) else {
        return;
    };
    let mine = net.add_host("n1").unwrap();
    // A pid above the kernel's pid_max can belong to no process: a run that is surely dead.
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let dead = pid_max + 1;
    let mut hand = HandMade(Vec::new());
    let stale_switch = hand.add(format!("tqc-{dead}-old"));
    let stale_host = hand.add(format!("tqc-{dead}-old-n1"));
    // Pid 1 is alive whatever else runs: its namespaces are not stale.
    let live = hand.add(format!("tqc-1-{}-live", std::process::id()));
    // Something still running in a stale namespace goes with it.
    let mut sleeper = std::process::Command::new("ip")
        .args(["netns", "exec", &stale_host, "sleep", "600"])
        .spawn()
        .unwrap();
    // In it before the cleaning starts: one still on its way in would be missed, and sleep on.
    wait_until("sleep to be inside the stale namespace", || {
        pids_in(&stale_host).contains(&sleeper.id())
    });

    let removed = Net::clean_stale().unwrap();

    for ns in [&stale_switch, &stale_host] {
        assert!(!exists(ns), "{ns} is still there (removed: {removed:?})");
    }
    assert!(exists(&live), "a live pid's namespace was removed");
    assert!(
        exists(net.switch_ns()) && exists(mine.ns()),
        "this run's own were removed"
    );
    assert_killed(&mut sleeper, "the process in the stale namespace");
}

#[test]
fn dropping_a_net_removes_its_namespaces_and_what_runs_in_them() {
    let Some(net) = setup("drop", Extra::None) else {
        return;
    };
    let host = net.add_host("n1").unwrap();
    let mut sleeper = host.command("sleep").arg("600").spawn().unwrap();
    wait_until("sleep to be inside the host", || {
        pids_in(host.ns()).contains(&sleeper.id())
    });
    let names = [net.switch_ns().to_owned(), host.ns().to_owned()];
    drop(net);
    for ns in &names {
        assert!(!exists(ns), "{ns} outlived its Net");
    }
    assert_killed(&mut sleeper, "sleep in the dropped Net");
}

/// The pids `ip netns pids` lists in `ns` (none when it cannot).
fn pids_in(ns: &str) -> Vec<u32> {
    let out = std::process::Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// `child` was killed by a signal: polled until it has exited, killed (and the test failed)
/// when it has not within [`WAIT`].
fn assert_killed(child: &mut std::process::Child, what: &str) {
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} was not killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "{what} ended with {status}"
    );
}

#[test]
fn a_failed_command_is_named_with_its_stderr() {
    let Some(net) = setup("dup", Extra::None) else {
        return;
    };
    let e = Net::create("dup").expect_err("a second run with the same id");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("`ip netns add ") && msg.contains("exists"),
        "{msg}"
    );
    let a = net.add_host("a").unwrap();
    assert!(net.add_host("a").is_err(), "a host name twice");
    assert!(net.cut(&a, &a).is_err());
    let elsewhere = Net::create("dup_other").unwrap();
    let stranger = elsewhere.add_host("b").unwrap();
    let e = net.cut(&a, &stranger).expect_err("a host of another run");
    assert!(format!("{e}").contains("is not in"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The processes

/// `role` of the node's `queue.cluster()`, asked from `from`, if it answers.
fn role(node: &Node, from: &Host) -> Option<String> {
    let mut c = node.connect(from, Duration::from_secs(1)).ok()?;
    let overview = c.call("queue.cluster", &pack_args(&[]), None).ok()?;
    let role = map_get(overview.first()?, "role")?;
    role.as_str().map(str::to_owned)
}

fn wait_leader(node: &Node, from: &Host) {
    wait_role(node, from, "lead", |role| role == Some("leader"));
}

/// Waits until `node`'s role, as `from` gets it, passes `want` (`None`: no answer).
fn wait_role(node: &Node, from: &Host, what: &str, want: impl Fn(Option<&str>) -> bool) {
    let mut last = None;
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        last = role(node, from);
        if want(last.as_deref()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "{} never came to {what} (last role {last:?}); its log:\n{}",
        node.name(),
        node.log_tail(40)
    );
}

#[test]
fn etcd_and_a_tarq_node_start_in_hosts_lead_and_survive_kill_and_pause() {
    let Some(net) = setup("procs", Extra::Processes) else {
        return;
    };
    let hosts = add_hosts(&net, &["e0", "n1", "client"]);
    let (e0, n1, client) = (&hosts[0], &hosts[1], &hosts[2]);
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(&etcd_bin().unwrap(), &[e0], &dir.path().join("etcd")).unwrap();
    let cfg = NodeConfig::new("n1", "chaos", &etcd.client_urls(), &dir.path().join("n1"))
        .args(&["--lease-ttl", "2"]);
    // A node that cannot start says why, with the end of its log.
    let bad = cfg.clone().args(&["--no-such-flag"]);
    let e = Node::start(&tarq_bin().unwrap(), n1, bad).expect_err("an unknown flag");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("exited") && msg.contains("--no-such-flag"),
        "{msg}"
    );
    let mut node = Node::start(&tarq_bin().unwrap(), n1, cfg).unwrap();
    wait_leader(&node, client);

    // kill -9 and a restart on the same data directory: it leads again, and what it
    // acknowledged before is still there.
    let mut c = node.connect(client, Duration::from_secs(2)).unwrap();
    c.call("queue.put", &pack_args(&["kept".into()]), None)
        .expect("a put on the leader");
    node.kill().unwrap();
    assert!(!node.is_running());
    node.restart().unwrap();
    assert!(node.is_running());
    wait_leader(&node, client);
    let mut c = node.connect(client, Duration::from_secs(2)).unwrap();
    let taken = c.call("queue.take", &pack_args(&[0.into()]), None).unwrap();
    let data = taken.first().and_then(|t| map_get(t, "data")).cloned();
    assert_eq!(
        data,
        Some("kept".into()),
        "the task after the restart: {taken:?}"
    );

    // Paused, it accepts (the kernel does) but greets nobody; resumed, it answers again.
    node.pause().unwrap();
    assert!(node.connect(client, Duration::from_millis(300)).is_err());
    node.resume().unwrap();
    node.wait_ready().unwrap();

    // Cut from etcd alone (the client still reaches it), it stops leading once its lease
    // runs out; healed, it leads again.
    net.partition(&[vec![n1], vec![e0]]).unwrap();
    wait_role(&node, client, "stop leading", |role| {
        role == Some("replica")
    });
    net.heal().unwrap();
    wait_leader(&node, client);

    // The etcd member too: killed and restarted on its data, it is healthy again.
    let member = etcd.member_mut(0);
    member.kill().unwrap();
    assert!(!member.is_running());
    member.restart().unwrap();
    member.wait_healthy().unwrap();
    member.pause().unwrap();
    member.resume().unwrap();
    wait_leader(&node, client);
    assert!(node.log_path().is_file());
}

#[test]
fn a_three_member_etcd_loses_one_and_takes_it_back() {
    let Some(net) = setup("etcd3", Extra::Processes) else {
        return;
    };
    let hosts = add_hosts(&net, &["e0", "e1", "e2"]);
    let refs: Vec<&Host> = hosts.iter().collect();
    let dir = tempfile::tempdir().unwrap();
    let mut etcd = Etcd::start(&etcd_bin().unwrap(), &refs, dir.path()).unwrap();
    assert_eq!(etcd.client_urls().split(',').count(), 3);

    etcd.member_mut(2).kill().unwrap();
    // Two of three are a quorum: the others stay healthy.
    etcd.member_mut(0).wait_healthy().unwrap();
    etcd.member_mut(2).restart().unwrap();
    etcd.member_mut(2).wait_healthy().unwrap();

    // Isolated, a member loses its quorum; healed, it has it again.
    net.partition(&[vec![&hosts[2]], vec![&hosts[0], &hosts[1]]])
        .unwrap();
    wait_until("the isolated member to say it is unhealthy", || {
        !etcd.member(2).is_healthy().unwrap()
    });
    assert!(
        etcd.member(0).is_healthy().unwrap(),
        "the majority kept its quorum"
    );
    net.heal().unwrap();
    etcd.member_mut(2).wait_healthy().unwrap();
}
