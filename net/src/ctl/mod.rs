//! `tarq ctl`: a command-line client of a running server — `put`, `take`, `ack`, `release`,
//! `stats`, `delete`, `touch` (on the seed's queue, or with `--tube` on a tube), the tube
//! commands `list-tubes`, `create-tube`, `drop-tube`, `peek`, `bury`, `kick` print their
//! result as JSON; a tube that does not exist is said so (the server answers with the
//! original's "Procedure ... is not defined"), `console` opens the
//! interactive console ([`console`]), `cluster` shows the members, leader, term and lags
//! and, on a sharded cluster, every replica set, the placement and each partition's counts
//! ([`cluster`]); `place` gives an empty partition to another replica set, in etcd
//! ([`place`]); `move` moves a partition with its tasks to another set, `rebalance` evens the
//! partitions (or tasks) out over the live sets and `drain` empties one set, through the
//! owners' primaries ([`moves`]). It speaks IPROTO through the one blocking client, behind
//! [`tarq_client::cluster::Cluster`]: `--addr` may list several nodes, and calls follow the
//! leader (redirects and reconnects are the client crate's, not ctl's). It is an operator's
//! tool, not part of the server's hot path.

pub mod cluster;
pub mod console;
pub mod moves;
pub mod place;
pub mod users;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use clap::{Args, Subcommand};
use rmpv::Value;

use tarq_client::cluster::{parse_addrs, Cluster, ClusterError, Effect, Options};
use tarq_client::pack_args;
use tarq_engine::DEFAULT_TUBE_NAME;
use tarq_iproto::codes::ER_NO_SUCH_PROC;

/// Default `--addr`: the server's default `--listen`.
pub const DEFAULT_ADDR: &str = "127.0.0.1:3301";

/// Default `--timeout` in seconds: for connecting and for each reply. A healthy server answers
/// in microseconds; ten seconds only rules out waiting for ever on a wedged one.
pub const DEFAULT_TIMEOUT_SECS: f64 = 10.0;

/// Default `--failover-wait` in seconds: an election ends within a few seconds.
pub const DEFAULT_FAILOVER_WAIT_SECS: f64 = 15.0;

/// `tarq ctl`: talk to a running tarq.
#[derive(Debug, Clone, Args)]
pub struct CtlArgs {
    /// The server's address, HOST:PORT; several, comma-separated or repeated, for a cluster:
    /// the first that answers is used, and a replica's refusal leads to its primary.
    #[arg(long, value_name = "HOST:PORT[,...]", default_value = DEFAULT_ADDR, action = clap::ArgAction::Append)]
    pub addr: Vec<String>,

    /// Seconds to keep trying the other addresses when the server in use is lost (a
    /// failover): reads are sent again, a change whose reply was lost is not.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, default_value_t = DEFAULT_FAILOVER_WAIT_SECS)]
    pub failover_wait: f64,

    /// Authenticate as this user (chap-sha1); guest when absent.
    #[arg(long, value_name = "NAME", requires = "password")]
    pub user: Option<String>,

    /// The password of --user.
    #[arg(long, value_name = "SECRET", requires = "user")]
    pub password: Option<String>,

    /// Seconds to wait for the connection and for each reply (a take also gets its own timeout).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true, default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout: f64,

    /// Work on this tube through the tarantool/queue API instead of the seed's queue (needed
    /// by peek, bury and kick).
    #[arg(long, value_name = "NAME")]
    pub tube: Option<String>,

    /// The server's --queue-namespace.
    #[arg(long, value_name = "NS", default_value = "queue")]
    pub namespace: String,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum CtlCommand {
    /// Put a task; DATA is JSON (`'{"a":1}'`, `42`, `'"s"'`), or else taken as a plain string.
    Put {
        #[arg(allow_negative_numbers = true)]
        data: String,
        /// Seconds before the task becomes ready.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        delay: Option<f64>,
        /// Seconds after which the task is deleted, in any state.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        ttl: Option<f64>,
        /// Seconds a taken task may stay taken before it is ready again.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        ttr: Option<f64>,
        /// Priority: lower is taken first.
        #[arg(long, allow_negative_numbers = true)]
        pri: Option<i64>,
    },
    /// Take a task (prints null when none is ready in time). The task is released when ctl
    /// exits, since the connection that took it closes: use the console to take and ack.
    Take {
        /// Seconds to wait for a task.
        #[arg(
            long,
            value_name = "SECONDS",
            allow_negative_numbers = true,
            default_value_t = 0.0
        )]
        timeout: f64,
    },
    /// Ack a task (only its taker's connection may).
    Ack {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
    },
    /// Release a task (only its taker's connection may).
    Release {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
        /// Seconds before it is ready again.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        delay: Option<f64>,
    },
    /// Print queue.stats() (with --tube: the tube's statistics).
    Stats,
    /// Create a tube (fifo, fifottl, limfifottl, utube, utubettl).
    CreateTube {
        name: String,
        #[arg(value_name = "TYPE")]
        kind: String,
        /// Default seconds a task lives (ttl types).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        ttl: Option<f64>,
        /// Default seconds a task may stay taken (ttl types).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        ttr: Option<f64>,
        /// Default priority (ttl types).
        #[arg(long, allow_negative_numbers = true)]
        pri: Option<i64>,
        /// Most tasks the tube holds (limfifottl).
        #[arg(long)]
        capacity: Option<u64>,
        /// Bury a task taken this many times instead of handing it out again.
        #[arg(long)]
        max_deliveries: Option<u64>,
        /// Seconds a put with a dedup_key returns the earlier task of the same key instead
        /// of a new one.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        dedup_window: Option<f64>,
        /// Split the tube into this many partitions over the replica sets of a sharded
        /// cluster (1 to 256; docs/sharding.md).
        #[arg(long, value_name = "N")]
        partitions: Option<u64>,
        /// No error when the tube exists.
        #[arg(long)]
        if_not_exists: bool,
    },
    /// Drop a tube (refused while one of its tasks is taken).
    DropTube { name: String },
    /// List the tubes of the tarantool/queue API (the seed's queue, tube `default`, is not
    /// listed), as a JSON array of names.
    ListTubes,
    /// Delete a task, in any state (of --tube, else of the seed's queue).
    Delete {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
    },
    /// Add DELTA seconds to a taken task's time to live and time to run (of --tube, else of
    /// the seed's queue); only its taker's connection may, as for ack.
    Touch {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
        #[arg(value_name = "DELTA", allow_negative_numbers = true)]
        delta: f64,
    },
    /// Show a task of --tube.
    Peek {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
    },
    /// Bury a task of --tube.
    Bury {
        #[arg(value_parser = task_id, allow_negative_numbers = true)]
        id: u64,
    },
    /// Kick up to COUNT buried tasks of --tube back to ready.
    Kick {
        #[arg(default_value_t = 1, value_parser = task_count, allow_negative_numbers = true)]
        count: u64,
    },
    /// Users and their grants (log in as an administrator with --user/--password): add,
    /// passwd, grant, revoke, list, drop. See docs/users.md.
    User {
        #[command(subcommand)]
        op: users::UserOp,
    },
    /// The cluster: members, leader, term and each replica's lag (`queue.cluster()`), and
    /// what each member says of itself (NOW: leading, following, not-leading, no-answer; a
    /// leader that stopped leading and etcd being unavailable are said above the table); from
    /// a server without failover, the replication figures of every --addr.
    Cluster {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Give partition PARTITION (0, 1, ...) of the partitioned TUBE to replica set SET: one
    /// change of the placement in etcd. It moves no task, so it refuses unless the current
    /// owner's primary counts the partition empty; the primitive later moves build on. Talks
    /// to etcd (and to the owner's primary); --addr only says where etcd is when --etcd or
    /// --cluster is left out.
    Place {
        /// The tube, as its name.
        tube: String,
        /// The partition's number, as `tarq ctl cluster` shows it (PARTITION, not INDEX).
        partition: u16,
        /// The replica set to own the partition.
        #[arg(long, value_name = "SET")]
        to: String,
        #[command(flatten)]
        at: moves::EtcdArgs,
    },
    /// Move partition PARTITION (0, 1, ...) of TUBE to replica set SET with all its tasks,
    /// while traffic runs: the owner's primary copies it and commits the change in etcd, then
    /// this prints its report (JSON: tasks moved, milliseconds). A refused or given-up move
    /// leaves the partition where it was. Talks to etcd and to the owner's primary (--addr
    /// only says where etcd is when --etcd or --cluster is left out); waits for the answer
    /// at least 10 minutes (or --timeout, if longer).
    Move {
        /// The tube, as its name.
        tube: String,
        /// The partition's number, as `tarq ctl cluster` shows it (PARTITION, not INDEX).
        partition: u16,
        /// The replica set to own the partition.
        #[arg(long, value_name = "SET")]
        to: String,
        #[command(flatten)]
        at: moves::EtcdArgs,
    },
    /// Even the partitions out over the replica sets that have a primary: plans moves from the
    /// most loaded set to the least loaded until every set owns within one partition of every
    /// other (--by tasks: until no move would narrow the gap between their task counts),
    /// prints the plan, then makes the moves one at a time, a line each. Ctrl-C stops it
    /// between moves: the move in flight ends on the server, committed or given up, never half
    /// done.
    Rebalance {
        /// What to even out: the partitions each set owns, or the tasks each holds (as the
        /// owners count them when the plan is made).
        #[arg(long, value_enum, default_value_t = moves::Balance::Count)]
        by: moves::Balance,
        /// Print the plan only; move nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        at: moves::EtcdArgs,
    },
    /// Move every partition of replica set SET to the other sets that have a primary (each to
    /// the one owning the fewest partitions), so SET owns nothing and its nodes can be
    /// stopped. Prints the plan, then each move; Ctrl-C stops it between moves, as rebalance.
    Drain {
        /// The replica set to empty.
        set: String,
        /// Print the plan only; move nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        at: moves::EtcdArgs,
    },
    /// Interactive console: type queue.put('x') and the like.
    Console {
        /// History file [default: ~/.tarq_history].
        #[arg(long, value_name = "FILE")]
        history: Option<PathBuf>,
    },
}

/// A task id from the command line; a negative one is read as a value (not taken for a flag)
/// and refused here, naming what an id is.
fn task_id(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| "a task id is a whole number, 0 or more".to_string())
}

/// `kick`'s COUNT, refused as [`task_id`] refuses an id.
fn task_count(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| "a count is a whole number, 0 or more".to_string())
}

/// Seconds as a `Duration`, refusing what cannot be one (negative, not a number, too long).
fn seconds(what: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{what} {s} must be a number of seconds, 0 or more"))
}

/// The value `tarq ctl put` sends for DATA: its JSON reading, else the string itself.
pub fn data_value(data: &str) -> Value {
    match serde_json::from_str::<serde_json::Value>(data) {
        Ok(json) => from_json(&json),
        Err(_) => Value::from(data),
    }
}

pub fn from_json(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Boolean(*b),
        J::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::from(u)
            } else if let Some(i) = n.as_i64() {
                Value::from(i)
            } else {
                Value::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::Array(a.iter().map(from_json).collect()),
        J::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (Value::from(k.as_str()), from_json(v)))
                .collect(),
        ),
    }
}

/// A MessagePack value as JSON: binary and extension values become base64 strings (extensions
/// as `{"ext": type, "data": base64}`), non-string map keys their JSON text, and non-finite
/// floats their name as a string.
pub fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => J::from(u),
            (None, Some(s)) => J::from(s),
            _ => J::Null,
        },
        Value::F32(f) => float(f64::from(*f)),
        Value::F64(f) => float(*f),
        Value::String(s) => match s.as_str() {
            Some(s) => J::from(s),
            None => J::from(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        },
        Value::Binary(b) => J::from(b64(b)),
        Value::Array(a) => J::Array(a.iter().map(to_json).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Value::String(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        other => to_json(other).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Value::Ext(t, data) => serde_json::json!({ "ext": t, "data": b64(data) }),
    }
}

fn float(f: f64) -> serde_json::Value {
    serde_json::Number::from_f64(f).map_or_else(
        || serde_json::Value::from(f.to_string()),
        serde_json::Value::Number,
    )
}

/// Pretty JSON text of a MessagePack value.
pub fn to_json_pretty(v: &Value) -> String {
    serde_json::to_string_pretty(&to_json(v)).expect("a JSON value always serialises")
}

/// An options map of the given (name, value) pairs that are set.
fn options(pairs: &[(&str, Option<Value>)]) -> Option<Value> {
    let set: Vec<(Value, Value)> = pairs
        .iter()
        .filter_map(|(k, v)| v.clone().map(|v| (Value::from(*k), v)))
        .collect();
    (!set.is_empty()).then_some(Value::Map(set))
}

/// What `tarq ctl` prints for an error: `Error: ` and the message, then its causes as
/// `anyhow` lists them, and never a backtrace, whatever RUST_BACKTRACE says (ctl's reader is
/// a person or a script, not a debugger).
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = format!("Error: {e}");
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    match causes.as_slice() {
        [] => {}
        [one] => text.push_str(&format!("\n\nCaused by:\n    {one}")),
        many => {
            text.push_str("\n\nCaused by:");
            for (i, c) in many.iter().enumerate() {
                text.push_str(&format!("\n    {i}: {c}"));
            }
        }
    }
    text
}

/// Runs a command that changes the placement in etcd (`place`, `move`, `rebalance`, `drain`);
/// `None` for any other.
fn run_on_etcd(
    command: &CtlCommand,
    addrs: &[String],
    opts: &Options,
    out: &mut dyn Write,
) -> Option<anyhow::Result<()>> {
    Some(match command {
        CtlCommand::Place {
            tube,
            partition,
            to,
            at,
        } => at.resolve(addrs, opts).and_then(|at| {
            let place = place::PlaceArgs {
                tube: tube.clone(),
                partition: *partition,
                to: to.clone(),
                at,
            };
            place::run(&place, opts, out)
        }),
        CtlCommand::Move {
            tube,
            partition,
            to,
            at,
        } => moves::run_move(tube, *partition, to, at, addrs, opts, out),
        CtlCommand::Rebalance { by, dry_run, at } => {
            moves::run_rebalance(*by, *dry_run, at, addrs, opts, out)
        }
        CtlCommand::Drain { set, dry_run, at } => {
            moves::run_drain(set, *dry_run, at, addrs, opts, out)
        }
        _ => return None,
    })
}

/// Runs one `tarq ctl` command, printing its result to `out`.
pub fn run(args: CtlArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let addrs = parse_addrs(&args.addr)
        .map_err(|e| anyhow::anyhow!("--addr {}: {e}", args.addr.join(",")))?;
    let opts = Options {
        timeout: seconds("--timeout", args.timeout)?,
        credentials: args.user.clone().zip(args.password.clone()),
        failover_wait: seconds("--failover-wait", args.failover_wait)?,
    };
    if let Some(done) = run_on_etcd(&args.command, &addrs, &opts, out) {
        return done;
    }
    let mut cluster = Cluster::connect(addrs.clone(), opts.clone()).map_err(|e| match e {
        ClusterError::NoneAnswered { .. } => anyhow::anyhow!(
            "{e}; is tarq running and listening there? --addr gives the addresses to try"
        ),
        e => e.into(),
    })?;
    match args.command {
        CtlCommand::Console { history } => return console::run(&mut cluster, history),
        CtlCommand::Cluster { json } => return cluster::run(&mut cluster, &opts, json, out),
        _ => {}
    }
    let Call {
        function,
        args: call_args,
        wait,
        tube,
        show,
    } = call_of(args.command, args.tube.as_deref(), &args.namespace)?;
    let effect = Effect::of(&function);
    let values = match cluster.call(&function, &pack_args(&call_args), wait, effect) {
        Ok(values) => values,
        Err(e) => {
            return Err(match tube {
                Some(tube) => why_no_method(&mut cluster, &args.namespace, &tube, e),
                None => e.into(),
            })
        }
    };
    // One result prints as itself; none (a take that found nothing) as null.
    let shown = show(values.into_iter().next().unwrap_or(Value::Nil));
    writeln!(out, "{}", serde_json::to_string(&to_json(&shown))?)?;
    Ok(())
}

/// The error of a call of a method of `tube` (`queue.tube.jobs:drop`) refused as
/// ER_NO_SUCH_PROC, which is what tarantool/queue answers for a tube that does not exist: its
/// methods live on the tube's object, so a missing tube's are not defined. The server keeps
/// that text for its clients, which may match it; ctl is read by a person, so it asks the
/// tube's statistics to tell a missing tube from a wrong --namespace (or a method the server
/// does not have, which keeps the server's text).
fn why_no_method(cluster: &mut Cluster, ns: &str, tube: &str, e: ClusterError) -> anyhow::Error {
    if e.server().is_none_or(|(code, _)| code != ER_NO_SUCH_PROC) {
        return e.into();
    }
    let statistics = format!("{ns}.statistics");
    let args = pack_args(&[Value::from(tube)]);
    match cluster.call(&statistics, &args, None, Effect::Reads) {
        Ok(_) => e.into(),
        Err(s) if s.server().is_some_and(|(code, _)| code == ER_NO_SUCH_PROC) => anyhow::anyhow!(
            "the server has no tarantool/queue API under the namespace '{ns}': give --namespace \
             as the server's --queue-namespace"
        ),
        // The original's `Tube 'NAME' does not exist`.
        Err(s)
            if s.server()
                .is_some_and(|(_, m)| m.contains("does not exist")) =>
        {
            anyhow::anyhow!(
                "tube '{tube}' does not exist (`tarq ctl list-tubes` lists the tubes, \
             `tarq ctl create-tube` makes one)"
            )
        }
        Err(_) => e.into(),
    }
}

/// The names of `queue.statistics()`'s map of tubes, sorted (an empty array when none).
fn tube_names(all: Value) -> Value {
    let mut names: Vec<String> = match all {
        Value::Map(tubes) => tubes
            .into_iter()
            .filter_map(|(k, _)| k.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    Value::Array(names.into_iter().map(Value::from).collect())
}

/// The call a command makes.
struct Call {
    function: String,
    args: Vec<Value>,
    /// How much longer than `--timeout` the reply may take (a take's own timeout).
    wait: Option<Duration>,
    /// The tube whose method this calls by name, if it does (for the error of a missing tube).
    tube: Option<String>,
    /// The result as printed.
    show: fn(Value) -> Value,
}

/// Where a command's call goes: the seed's queue, or `tube` through the API under `ns`.
#[derive(Clone, Copy)]
struct Names<'a> {
    tube: Option<&'a str>,
    ns: &'a str,
}

impl<'a> Names<'a> {
    /// A call of `function`, on `tube` when it is one of the tube's methods (for the error of
    /// a missing tube).
    fn call(self, function: String, args: Vec<Value>) -> Call {
        Call {
            tube: self
                .tube
                .filter(|t| function.starts_with(&format!("{}.tube.{t}:", self.ns)))
                .map(str::to_owned),
            function,
            args,
            wait: None,
            show: |v| v,
        }
    }

    /// `queue.put` on the seed's queue, `queue.tube.<name>:put` on a tube.
    fn method(self, seed: &str, m: &str) -> String {
        match self.tube {
            None => seed.to_string(),
            Some(t) => format!("{}.tube.{t}:{m}", self.ns),
        }
    }

    /// A method only a tube has: refused without `--tube`.
    fn on_tube(self, m: &str) -> anyhow::Result<String> {
        self.tube
            .map(|t| format!("{}.tube.{t}:{m}", self.ns))
            .ok_or_else(|| anyhow::anyhow!("{m} works on a tube: give --tube NAME"))
    }

    /// A method the seed's queue has only through the tube API: on its tube `default`.
    fn on_tube_or_seed(self, m: &str) -> String {
        format!("{}.tube.{}:{m}", self.ns, self.tube_or_default())
    }

    fn tube_or_default(self) -> &'a str {
        self.tube.unwrap_or(DEFAULT_TUBE_NAME)
    }
}

/// The call of `command`: on the seed's queue, or on `tube` through the API under `ns`. A flat
/// table, one arm per command; the arms with options build them in a function of their own.
fn call_of(command: CtlCommand, tube: Option<&str>, ns: &str) -> anyhow::Result<Call> {
    let n = Names { tube, ns };
    Ok(match command {
        CtlCommand::Console { .. }
        | CtlCommand::Cluster { .. }
        | CtlCommand::Place { .. }
        | CtlCommand::Move { .. }
        | CtlCommand::Rebalance { .. }
        | CtlCommand::Drain { .. } => {
            unreachable!("the console, cluster and the shard commands are run by `run`")
        }
        put @ CtlCommand::Put { .. } => n.call(n.method("queue.put", "put"), put_args(put)),
        CtlCommand::Take { timeout } => {
            let wait = Some(seconds("--timeout of take", timeout)?);
            // The seed waits for no argument; the tube API waits for ever without one.
            let a = match (timeout > 0.0, tube) {
                (true, _) | (false, Some(_)) => vec![Value::F64(timeout)],
                (false, None) => vec![],
            };
            Call {
                wait,
                ..n.call(n.method("queue.take", "take"), a)
            }
        }
        CtlCommand::Ack { id } => n.call(n.method("queue.ack", "ack"), vec![Value::from(id)]),
        CtlCommand::Release { id, delay } => {
            let mut a = vec![Value::from(id)];
            a.extend(options(&[("delay", delay.map(Value::F64))]));
            n.call(n.method("queue.release", "release"), a)
        }
        CtlCommand::Stats => match tube {
            None => n.call("queue.stats".into(), vec![]),
            Some(t) => n.call(format!("{ns}.statistics"), vec![Value::from(t)]),
        },
        create @ CtlCommand::CreateTube { .. } => {
            n.call(format!("{ns}.create_tube"), create_tube_args(create))
        }
        CtlCommand::DropTube { name } => Call {
            tube: Some(name.clone()),
            ..n.call(format!("{ns}.tube.{name}:drop"), vec![])
        },
        CtlCommand::ListTubes => Call {
            show: tube_names,
            ..n.call(format!("{ns}.statistics"), vec![])
        },
        CtlCommand::Delete { id } => Call {
            tube: Some(n.tube_or_default().to_owned()),
            ..n.call(n.on_tube_or_seed("delete"), vec![Value::from(id)])
        },
        CtlCommand::Touch { id, delta } => Call {
            tube: Some(n.tube_or_default().to_owned()),
            ..n.call(
                n.on_tube_or_seed("touch"),
                vec![Value::from(id), Value::F64(delta)],
            )
        },
        CtlCommand::Peek { id } => n.call(n.on_tube("peek")?, vec![Value::from(id)]),
        CtlCommand::Bury { id } => n.call(n.on_tube("bury")?, vec![Value::from(id)]),
        CtlCommand::Kick { count } => n.call(n.on_tube("kick")?, vec![Value::from(count)]),
        CtlCommand::User { op } => {
            let (function, args) = users::call_of(op, tube)?;
            n.call(function, args)
        }
    })
}

/// A put's arguments: the data, then the options given.
fn put_args(put: CtlCommand) -> Vec<Value> {
    let CtlCommand::Put {
        data,
        delay,
        ttl,
        ttr,
        pri,
    } = put
    else {
        unreachable!("put_args of a put")
    };
    let mut a = vec![data_value(&data)];
    a.extend(options(&[
        ("delay", delay.map(Value::F64)),
        ("ttl", ttl.map(Value::F64)),
        ("ttr", ttr.map(Value::F64)),
        ("pri", pri.map(Value::from)),
    ]));
    a
}

/// `create_tube`'s arguments: name, type, then the options given.
fn create_tube_args(create: CtlCommand) -> Vec<Value> {
    let CtlCommand::CreateTube {
        name,
        kind,
        ttl,
        ttr,
        pri,
        capacity,
        max_deliveries,
        dedup_window,
        partitions,
        if_not_exists,
    } = create
    else {
        unreachable!("create_tube_args of a create-tube")
    };
    let mut a = vec![Value::from(name), Value::from(kind)];
    a.extend(options(&[
        ("ttl", ttl.map(Value::F64)),
        ("ttr", ttr.map(Value::F64)),
        ("pri", pri.map(Value::from)),
        ("capacity", capacity.map(Value::from)),
        ("max_deliveries", max_deliveries.map(Value::from)),
        ("dedup_window", dedup_window.map(Value::F64)),
        ("partitions", partitions.map(Value::from)),
        (
            "if_not_exists",
            if_not_exists.then_some(Value::Boolean(true)),
        ),
    ]));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_data_is_json_or_else_a_string() {
        for (arg, want) in [
            ("42", Value::from(42u64)),
            ("-1", Value::from(-1i64)),
            ("1.5", Value::F64(1.5)),
            ("\"s\"", Value::from("s")),
            ("hello world", Value::from("hello world")),
            (
                "{\"a\":[1,null]}",
                Value::Map(vec![(
                    Value::from("a"),
                    Value::Array(vec![Value::from(1u64), Value::Nil]),
                )]),
            ),
            ("{broken", Value::from("{broken")),
        ] {
            assert_eq!(data_value(arg), want, "{arg}");
        }
    }

    #[test]
    fn a_negative_number_of_seconds_is_a_value_refused_with_its_range() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["ctl", "--timeout", "-1", "stats"])
            .expect("-1 is the value of --timeout, not a flag");
        let err = seconds("--timeout", cli.ctl.timeout)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "--timeout -1 must be a number of seconds, 0 or more");
        assert!(
            <Cli as clap::Parser>::try_parse_from(["ctl", "put", "x", "--delay", "-1"]).is_ok()
        );
        let put = <Cli as clap::Parser>::try_parse_from(["ctl", "put", "-1"]).unwrap();
        assert!(matches!(put.ctl.command, CtlCommand::Put { data, .. } if data == "-1"));
        let Err(e) = <Cli as clap::Parser>::try_parse_from(["ctl", "ack", "-1"]) else {
            panic!("a negative id parsed");
        };
        assert!(
            e.to_string()
                .contains("invalid value '-1' for '<ID>': a task id is a whole number, 0 or more"),
            "{e}"
        );
    }

    #[test]
    fn addr_takes_lists_and_repeats() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            ctl: CtlArgs,
        }
        let addrs = |argv: &[&str]| {
            let cli = <Cli as clap::Parser>::try_parse_from(argv).unwrap();
            parse_addrs(&cli.ctl.addr).unwrap()
        };
        assert_eq!(addrs(&["ctl", "stats"]), [DEFAULT_ADDR]);
        assert_eq!(
            addrs(&["ctl", "--addr", "a:1,b:2", "--addr", "c:3", "stats"]),
            ["a:1", "b:2", "c:3"]
        );
    }

    #[test]
    fn msgpack_shows_as_json() {
        let v = Value::Map(vec![
            (Value::from("id"), Value::from(7u64)),
            (Value::from("runat"), Value::F64(0.0)),
            (Value::from(1u64), Value::Binary(vec![0xff, 0])),
            (Value::from("inf"), Value::F64(f64::INFINITY)),
            (Value::from("e"), Value::Ext(3, vec![1])),
            (Value::from("neg"), Value::from(-5i64)),
        ]);
        assert_eq!(
            to_json(&v).to_string(),
            r#"{"id":7,"runat":0.0,"1":"/wA=","inf":"inf","e":{"ext":3,"data":"AQ=="},"neg":-5}"#
        );
    }
}
