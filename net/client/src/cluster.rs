//! A client of several tarq nodes that follows the leader: the one place where the redirect
//! and reconnect rules live, for `tarq ctl`, its console and the load generator's probe.
//!
//! - **Addresses**: [`parse_addrs`] reads `--addr A,B,C` (and repeated `--addr`) into a list.
//!   [`Cluster::connect`] talks to the first that answers (one pass, so a command against a
//!   stopped cluster fails at once, naming every address and why). A server that answers and
//!   refuses the login ends it at once ([`ClusterError::LoginRefused`]): a cluster shares its
//!   credentials, so the other addresses would refuse them too.
//! - **Redirects**: a replica refuses a change with ER_READONLY (7) and the message
//!   `read-only replica: the primary is ADDR` ([`primary_in`] reads ADDR). Nothing was done,
//!   so any call is retried on the primary it names; at most [`MAX_REDIRECTS`] refusals in a
//!   row, then [`ClusterError::TooManyRedirects`] with the path taken.
//! - **Lost connections**: when the node in use stops answering (or a refusal names a primary
//!   that cannot be reached, or names none: an election in progress), the other addresses are
//!   tried in turn with a backoff for at most `failover_wait`, then
//!   [`ClusterError::NoLeader`] names every address tried and its last answer.
//! - **What is retried**: a call that only reads ([`Effect::Reads`]) is sent again after a
//!   lost connection. A change ([`Effect::Changes`]: put, take, ack, ...) whose connection was
//!   lost after it was sent is *not*: the server may or may not have applied it, and a second
//!   put would be a second task. It fails with [`ClusterError::LostDuringChange`] (the next
//!   call reconnects). A connection found closed *before* sending is replaced first, so a call
//!   after a failover is not lost just because the old socket was dead.
//!
//! It holds one [`Client`] at a time and is blocking, like it: an operator's and a test's tool.

use std::time::{Duration, Instant};

use rmpv::Value;

use crate::{Client, ClientError};
use tarq_iproto::codes::{
    ER_ACCESS_DENIED, ER_NO_SUCH_PROC, ER_NO_SUCH_USER, ER_PASSWORD_MISMATCH, ER_READONLY,
};

/// Refusals followed in a row for one call before giving up: a healthy cluster needs one (a
/// replica names the leader); more means stale or circular information.
pub const MAX_REDIRECTS: usize = 3;

/// Default time to keep trying the addresses after the node in use is lost: an etcd lease
/// expires and a replica is promoted within a few seconds (the lease TTL, 3 s by default,
/// plus about half a second; the failover tests see a new primary serve within 5 s), so 15 s
/// leaves room for a slow election without waiting for ever on a cluster that is gone.
pub const DEFAULT_FAILOVER_WAIT: Duration = Duration::from_secs(15);

/// First pause between two rounds over the addresses while none takes the call; it doubles up
/// to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between two rounds: a new leader is noticed within this.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// What the server's read-only refusal says before the primary's address (the contract between
/// the server's `Refusal::ReadOnly` and every client).
pub const PRIMARY_IS: &str = "the primary is ";

/// A `--addr` list that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("no address given")]
    Empty,
    #[error("empty address in {0:?} (addresses are separated by commas)")]
    Blank(String),
    #[error("{0:?} is not HOST:PORT")]
    NotHostPort(String),
}

/// The addresses of `args`, each a comma-separated list, in order, without repeats.
pub fn parse_addrs<S: AsRef<str>>(args: &[S]) -> Result<Vec<String>, AddrError> {
    let mut out: Vec<String> = Vec::new();
    for arg in args {
        let arg = arg.as_ref();
        for item in arg.split(',') {
            let a = item.trim();
            if a.is_empty() {
                return Err(AddrError::Blank(arg.to_string()));
            }
            if !is_host_port(a) {
                return Err(AddrError::NotHostPort(a.to_string()));
            }
            if !out.iter().any(|o| o == a) {
                out.push(a.to_string());
            }
        }
    }
    if out.is_empty() {
        return Err(AddrError::Empty);
    }
    Ok(out)
}

/// `HOST:PORT` with a non-empty host (a name, an IPv4 address or a bracketed IPv6 one) and a
/// port number.
fn is_host_port(a: &str) -> bool {
    let Some((host, port)) = a.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']').is_some_and(|h| !h.is_empty()),
        None => !host.is_empty() && !host.contains(':') && !host.contains(char::is_whitespace),
    };
    host_ok && !port.is_empty() && port.parse::<u16>().is_ok()
}

/// The primary a read-only refusal names (`read-only replica: the primary is 127.0.0.1:3301`),
/// if it names one that reads as HOST:PORT. Tolerant of text around it, so a server that adds
/// a term or a reason after the address still redirects its clients.
pub fn primary_in(message: &str) -> Option<&str> {
    let rest = &message[message.find(PRIMARY_IS)? + PRIMARY_IS.len()..];
    let addr = rest
        .split_whitespace()
        .next()?
        .trim_end_matches([',', ';', ')']);
    is_host_port(addr).then_some(addr)
}

/// Whether a call may be sent again after its connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// It changes nothing (stats, statistics, peek, cluster): sending it twice is harmless.
    Reads,
    /// It may change the queue: after a lost connection it may or may not have been applied.
    Changes,
}

impl Effect {
    /// The effect of calling `function` by name: the few calls known to only read, and every
    /// other call (including one this client does not know) a change.
    pub fn of(function: &str) -> Effect {
        let method = function.rsplit([':', '.']).next().unwrap_or(function);
        let reads = matches!(
            function,
            "queue.stats" | "queue.statistics" | "queue.state" | "queue.cluster"
        ) || (function.contains(':') && method == "peek")
            || function.ends_with(".statistics");
        if reads {
            Effect::Reads
        } else {
            Effect::Changes
        }
    }
}

/// How a [`Cluster`] connects and how long it keeps trying.
#[derive(Debug, Clone)]
pub struct Options {
    /// For connecting and for each reply, as [`Client::connect`].
    pub timeout: Duration,
    /// `(user, password)` for chap-sha1, on every connection; guest when absent.
    pub credentials: Option<(String, String)>,
    /// After losing the node in use: how long to keep trying the addresses.
    pub failover_wait: Duration,
}

impl Options {
    pub fn new(timeout: Duration) -> Options {
        Options {
            timeout,
            credentials: None,
            failover_wait: DEFAULT_FAILOVER_WAIT,
        }
    }
}

/// One address tried and what it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub addr: String,
    pub outcome: String,
}

fn list(tried: &[Attempt]) -> String {
    tried
        .iter()
        .map(|a| format!("{} ({})", a.addr, a.outcome))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What can go wrong talking to a cluster, beyond one server's own errors.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Addr(#[from] AddrError),
    /// The first pass over the addresses found no server.
    #[error("no server answered: {}", list(.tried))]
    NoneAnswered { tried: Vec<Attempt> },
    /// A server answered and refused the login: the same credentials would be refused by the
    /// other nodes of a cluster too (it shares them), so no other address is tried.
    #[error("{addr} answered but refused the login as {user:?}: {message} (code {code}); check the user name and password")]
    LoginRefused {
        addr: String,
        user: String,
        code: u32,
        message: String,
    },
    /// Refusals kept naming another node.
    #[error("{function} was refused as read-only {} times in a row: {}", .path.len(), .path.join(" -> "))]
    TooManyRedirects { function: String, path: Vec<String> },
    /// The node in use was lost and no other took the call in time.
    #[error("no leader took {function} within {waited:.1} s: tried {}", list(.tried))]
    NoLeader {
        function: String,
        waited: f64,
        tried: Vec<Attempt>,
    },
    /// A change was sent and its connection lost before the reply: not retried.
    #[error("the connection to {addr} was lost during {function} ({source}): it may or may not have been applied, so it was not sent again")]
    LostDuringChange {
        addr: String,
        function: String,
        source: ClientError,
    },
    /// The server answered, with an error or something unreadable.
    #[error(transparent)]
    Client(#[from] ClientError),
}

impl ClusterError {
    /// The server's own error (code, message), when that is what this is.
    pub fn server(&self) -> Option<(u32, &str)> {
        match self {
            ClusterError::Client(ClientError::Server { code, message }) => {
                Some((*code, message.as_str()))
            }
            _ => None,
        }
    }
}

/// True for an error after which the connection cannot be trusted: the socket is gone or a
/// reply did not come.
fn lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Io(_) | ClientError::Closed | ClientError::Timeout(_)
    )
}

/// Several addresses, one connection: to the leader once a refusal has named it.
pub struct Cluster {
    /// The addresses given, then the primaries refusals named, in the order tried.
    addrs: Vec<String>,
    opts: Options,
    conn: Option<(String, Client)>,
}

impl Cluster {
    /// Connects to the first of `addrs` that answers (greeting and authentication).
    pub fn connect(addrs: Vec<String>, opts: Options) -> Result<Cluster, ClusterError> {
        if addrs.is_empty() {
            return Err(AddrError::Empty.into());
        }
        let mut c = Cluster {
            addrs,
            opts,
            conn: None,
        };
        let mut tried = Vec::new();
        for i in 0..c.addrs.len() {
            let addr = c.addrs[i].clone();
            match c.open(&addr) {
                Ok(()) => return Ok(c),
                Err(ClientError::Server { code, message })
                    if matches!(
                        code,
                        ER_ACCESS_DENIED | ER_NO_SUCH_USER | ER_PASSWORD_MISMATCH
                    ) =>
                {
                    let user = c.opts.credentials.clone().unwrap_or_default().0;
                    return Err(ClusterError::LoginRefused {
                        addr,
                        user,
                        code,
                        message,
                    });
                }
                Err(e) => tried.push(Attempt {
                    addr,
                    outcome: e.to_string(),
                }),
            }
        }
        Err(ClusterError::NoneAnswered { tried })
    }

    /// The address of the node in use (`None` after it was lost, until the next call).
    pub fn addr(&self) -> Option<&str> {
        self.conn.as_ref().map(|(a, _)| a.as_str())
    }

    /// Every address known: those given, then those refusals named.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The connection in use, for a caller that needs the plain client (its greeting).
    pub fn client(&mut self) -> Option<&mut Client> {
        self.conn.as_mut().map(|(_, c)| c)
    }

    fn open(&mut self, addr: &str) -> Result<(), ClientError> {
        self.conn = None;
        let mut c = Client::connect(addr, self.opts.timeout)?;
        if let Some((user, password)) = &self.opts.credentials {
            c.auth(user, password)?;
        }
        self.conn = Some((addr.to_string(), c));
        Ok(())
    }

    fn learn(&mut self, addr: &str) {
        if !self.addrs.iter().any(|a| a == addr) {
            self.addrs.push(addr.to_string());
        }
    }

    /// Moves to the leader before any change is sent, for a caller that cannot follow
    /// refusals on its own connections (the load generator's event loop): the leader
    /// `queue.cluster()` names, or, from a server without that call, the first address whose
    /// `queue.stats()` shows no `replication_position` (it is no replica). Returns the
    /// leader's address; `None` when every node that answered is a replica (the connection
    /// then stays on the first: changes sent there are refused naming the primary).
    pub fn find_leader(&mut self) -> Result<Option<String>, ClusterError> {
        match self.call("queue.cluster", &[0x90], None, Effect::Reads) {
            Ok(values) => {
                // `{name, addr}` from tarq; a bare address is taken too.
                let leader = (values.first().and_then(|m| map_get(m, "leader")))
                    .and_then(|l| l.as_str().or_else(|| map_get(l, "addr")?.as_str()))
                    .map(str::to_string);
                if let Some(leader) = leader {
                    if self.addr() != Some(leader.as_str()) {
                        self.learn(&leader);
                        self.open(&leader)?;
                    }
                    return Ok(Some(leader));
                }
            }
            Err(e) if e.server().is_some_and(|(code, _)| code == ER_NO_SUCH_PROC) => {}
            Err(e) => return Err(e),
        }
        let mut first = None;
        for addr in self.addrs.clone() {
            if self.open(&addr).is_err() {
                continue;
            }
            first.get_or_insert_with(|| addr.clone());
            let (_, c) = self.conn.as_mut().expect("just opened");
            let stats = c.call("queue.stats", &[0x90], None)?;
            let replica = stats
                .first()
                .is_some_and(|m| map_get(m, "replication_position").is_some());
            if !replica {
                return Ok(Some(addr));
            }
        }
        match first {
            Some(addr) => self.open(&addr)?,
            None => {
                return Err(ClusterError::NoneAnswered {
                    tried: self
                        .addrs
                        .iter()
                        .map(|a| Attempt {
                            addr: a.clone(),
                            outcome: "no answer".into(),
                        })
                        .collect(),
                })
            }
        }
        Ok(None)
    }

    /// Calls `function` with `args` (a MessagePack array) on the leader, following refusals
    /// and, within `failover_wait`, lost connections, as the module says. `wait` lengthens the
    /// reply timeout for a call that may wait (a take).
    pub fn call(
        &mut self,
        function: &str,
        args: &[u8],
        wait: Option<Duration>,
        effect: Effect,
    ) -> Result<Vec<Value>, ClusterError> {
        let mut s = Search::new(function, self.opts.failover_wait);
        // A primary a refusal named: tried before the addresses in turn.
        let mut next: Option<String> = None;
        loop {
            if let Some(target) = next.take() {
                if let Err(e) = self.open(&target) {
                    s.failed(target, &e);
                    continue;
                }
            } else if !self.conn.as_ref().is_some_and(|(_, c)| c.is_open()) {
                // Lost, or found closed before anything was sent: safe for any call.
                let addr = s.next_addr(&self.addrs)?;
                if let Err(e) = self.open(&addr) {
                    s.failed(addr, &e);
                    continue;
                }
            }
            let (addr, client) = self.conn.as_mut().expect("connected above");
            let addr = addr.clone();
            match client.call(function, args, wait) {
                Ok(values) => return Ok(values),
                Err(ClientError::Server { code, message }) if code == ER_READONLY => {
                    match primary_in(&message)
                        .filter(|p| *p != addr)
                        .map(str::to_string)
                    {
                        Some(primary) => {
                            s.path.push(addr.clone());
                            s.note(addr, message);
                            if s.path.len() > MAX_REDIRECTS {
                                s.path.push(primary);
                                return Err(ClusterError::TooManyRedirects {
                                    function: function.to_string(),
                                    path: s.path,
                                });
                            }
                            self.learn(&primary);
                            next = Some(primary);
                        }
                        // No primary named: an election in progress. Wait for a leader as
                        // after a lost connection; nothing was done, so any call may retry.
                        None => {
                            self.conn = None;
                            s.note(addr, message);
                            s.path.clear();
                        }
                    }
                }
                Err(e) if lost(&e) => {
                    self.conn = None;
                    if effect == Effect::Changes {
                        return Err(ClusterError::LostDuringChange {
                            addr,
                            function: function.to_string(),
                            source: e,
                        });
                    }
                    s.failed(addr, &e);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// The state of one call's search for a leader.
struct Search<'f> {
    function: &'f str,
    wait: Duration,
    /// Nodes that refused in a row, each naming the next.
    path: Vec<String>,
    /// Every address tried and its answer, for the error.
    tried: Vec<Attempt>,
    /// Set when the search starts (the node in use is lost): no new round after it.
    deadline: Option<Instant>,
    backoff: Duration,
    /// Addresses taken in turn so far.
    turn: usize,
}

impl<'f> Search<'f> {
    fn new(function: &'f str, wait: Duration) -> Search<'f> {
        Search {
            function,
            wait,
            path: Vec::new(),
            tried: Vec::new(),
            deadline: None,
            backoff: FIRST_BACKOFF,
            turn: 0,
        }
    }

    fn note(&mut self, addr: String, outcome: String) {
        self.tried.push(Attempt { addr, outcome });
    }

    /// `addr` could not be reached or was lost: refusals count afresh from the next node.
    fn failed(&mut self, addr: String, e: &ClientError) {
        self.note(addr, e.to_string());
        self.path.clear();
    }

    /// The next address in turn, pausing between rounds; the error once `wait` has passed
    /// since the search started.
    fn next_addr(&mut self, addrs: &[String]) -> Result<String, ClusterError> {
        let deadline = *self
            .deadline
            .get_or_insert_with(|| Instant::now() + self.wait);
        if self.turn > 0 && self.turn.is_multiple_of(addrs.len()) {
            let left = deadline.saturating_duration_since(Instant::now());
            std::thread::sleep(self.backoff.min(left));
            self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        }
        if Instant::now() >= deadline {
            return Err(ClusterError::NoLeader {
                function: self.function.to_string(),
                waited: self.wait.as_secs_f64(),
                tried: last_per_addr(std::mem::take(&mut self.tried)),
            });
        }
        let addr = addrs[self.turn % addrs.len()].clone();
        self.turn += 1;
        Ok(addr)
    }
}

/// The value under the string key `key` of a MessagePack map (`None` for anything else).
pub fn map_get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// Each address once, with what it answered last, in the order first tried.
fn last_per_addr(tried: Vec<Attempt>) -> Vec<Attempt> {
    let mut out: Vec<Attempt> = Vec::new();
    for a in tried {
        match out.iter_mut().find(|o| o.addr == a.addr) {
            Some(o) => o.outcome = a.outcome,
            None => out.push(a),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_testkit::ports::Refusing;

    #[test]
    fn addresses_are_lists_of_host_port() {
        let ok: &[(&[&str], &[&str])] = &[
            (&["127.0.0.1:3301"], &["127.0.0.1:3301"]),
            (&["a:1,b:2", "c:3"], &["a:1", "b:2", "c:3"]),
            (&[" a:1 , b:2 "], &["a:1", "b:2"]),
            (&["a:1,a:1", "a:1"], &["a:1"]),
            (
                &["[::1]:3301,localhost:3302"],
                &["[::1]:3301", "localhost:3302"],
            ),
        ];
        for (args, want) in ok {
            assert_eq!(parse_addrs(args).unwrap(), *want, "{args:?}");
        }
        let bad: &[(&[&str], AddrError)] = &[
            (&[], AddrError::Empty),
            (&["a:1,,b:2"], AddrError::Blank("a:1,,b:2".into())),
            (&["a:1,"], AddrError::Blank("a:1,".into())),
            (&["a"], AddrError::NotHostPort("a".into())),
            (&[":3301"], AddrError::NotHostPort(":3301".into())),
            (&["a:"], AddrError::NotHostPort("a:".into())),
            (&["a:99999"], AddrError::NotHostPort("a:99999".into())),
            (&["::1:3301"], AddrError::NotHostPort("::1:3301".into())),
            (&["[]:1"], AddrError::NotHostPort("[]:1".into())),
        ];
        for (args, want) in bad {
            assert_eq!(parse_addrs(args).unwrap_err(), *want, "{args:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_primary() {
        let cases = [
            (
                "read-only replica: the primary is 127.0.0.1:3301",
                Some("127.0.0.1:3301"),
            ),
            (
                "read-only replica: the primary is [::1]:3301",
                Some("[::1]:3301"),
            ),
            (
                "read-only replica: the primary is db1.example:3301 (term 4)",
                Some("db1.example:3301"),
            ),
            (
                "read-only replica: the primary is 10.0.0.2:3301, term 7",
                Some("10.0.0.2:3301"),
            ),
            ("read-only replica: the primary is ", None),
            ("read-only replica: the primary is unknown", None),
            ("read-only: no leader elected yet", None),
            ("Task was not taken", None),
        ];
        for (message, want) in cases {
            assert_eq!(primary_in(message), want, "{message}");
        }
    }

    #[test]
    fn only_known_reads_are_retried_after_a_lost_connection() {
        for f in [
            "queue.stats",
            "queue.statistics",
            "queue.cluster",
            "queue.state",
            "queue.tube.jobs:peek",
            "box.queue.statistics",
        ] {
            assert_eq!(Effect::of(f), Effect::Reads, "{f}");
        }
        for f in [
            "queue.put",
            "queue.take",
            "queue.ack",
            "queue.tube.jobs:put",
            "queue.tube.peek:put",
            "queue.create_tube",
            "queue.something_new",
        ] {
            assert_eq!(Effect::of(f), Effect::Changes, "{f}");
        }
    }

    #[test]
    fn none_answering_names_every_address() {
        // Held, never listening: no other test's server can answer there meanwhile.
        let held = [Refusing::open(), Refusing::open()];
        let addrs: Vec<String> = held.iter().map(|r| r.addr.to_string()).collect();
        let Err(e) = Cluster::connect(addrs.clone(), Options::new(Duration::from_secs(2))) else {
            panic!("connected to nothing");
        };
        let text = e.to_string();
        for a in &addrs {
            assert!(
                text.contains(&format!("{a} (cannot connect to {a}")),
                "{text}"
            );
        }
    }
}
