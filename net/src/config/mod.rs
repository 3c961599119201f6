//! The server's configuration: one declaration per setting ([`Settings`]), read from four
//! layers — the command line over the environment (`TARQ_...`) over the `--config` TOML file
//! over the defaults — and resolved into the checked [`Config`] the server runs with.
//!
//! clap reads the command line and the environment ([`Cli`], `env = "TARQ_..."` on each flag),
//! serde reads the file into the same [`Settings`], and clap lays what it found over the
//! file's values ([`Config::load`]). A new setting is one field in [`Settings`] (its flag, its
//! variable and its TOML key at once), a default, and a line in [`Config`]. Checks that need
//! several settings, and the ranges of values from the file, live in [`Config::validate`].
//! `tarq ctl`'s flags are its own (`crate::ctl`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use serde::Deserialize;

use crate::ctl::CtlArgs;
use tarq_engine::{Micros, MAX_TASKS};
use tarq_iproto::DEFAULT_MAX_FRAME_BYTES;
use tarq_ops::graphite::{self, Target};
use tarq_ops::OpsConfig;
use tarq_wal::{WalConfig, WalMode};

pub mod limits;
pub mod tls;

use limits::default_input_budget;
pub use limits::LimitsConfig;
pub use tls::{TlsConfig, TlsFiles, TlsMode, DEFAULT_TLS_HELLO_WAIT};

/// Default `--listen`: Tarantool's port, on loopback only until the operator opens it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:3301";

/// Default `--data-dir`.
pub const DEFAULT_DATA_DIR: &str = "./data";

/// Default `--max-connections`: below the common soft limit of 1024 open files, leaving room for
/// the listener and data files. Each connection holds at least a 16 KiB read buffer.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1000;

/// Default `--max-write-backlog`: replies a client has not read yet, per connection. Twice the
/// default frame cap, so one maximal reply always fits while a client that never reads is cut
/// off after a bounded amount.
pub const DEFAULT_MAX_WRITE_BACKLOG: usize = 2 * DEFAULT_MAX_FRAME_BYTES;

/// Smallest `--max-frame-bytes` accepted: a request header and a small call fit in it.
pub const MIN_FRAME_BYTES: usize = 64;

/// Highest connection count a token can address (the slot index has 32 bits in a token).
pub const MAX_CONNECTIONS_LIMIT: usize = 1 << 24;

/// Longest `--busy-poll`: a second. The option is for requests microseconds apart; a spin
/// longer than the loop's coarsest own deadline (its reports, each second) would be a loop
/// that never sleeps, which is not what the setting says.
pub const MAX_BUSY_POLL_MICROS: u64 = 1_000_000;

/// Highest `--user-put-rate`: a million puts a second, above what one node serves, so the
/// limit is never a rounding of nothing (a put's share of a second stays a whole microsecond).
pub const MAX_USER_PUT_RATE: u64 = 1_000_000;

/// The command line of `tarq`: a subcommand, or the `--config` file and the [`Settings`].
#[derive(Debug, Clone, Default, Parser)]
#[command(
    name = "tarq",
    version,
    about = "tarq: a task-queue broker speaking Tarantool's binary protocol (IPROTO)",
    after_help = "Every setting is a flag, an environment variable (TARQ_ and the flag's name in \
                  capitals: TARQ_MAX_CONNECTIONS=100) and a key of the TOML file given with \
                  --config, under the flag's name (max-connections = 100). The command line \
                  wins over the environment, the environment over the file, the file over the \
                  default. A yes/no setting takes a value to turn it off: --null=false, \
                  TARQ_NULL=false.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// `tarq ctl ...`: a client of a running server instead of a server.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// TOML file with settings under the same names as these flags.
    #[arg(long, env = "TARQ_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub settings: Settings,
}

impl Cli {
    /// The process's command line and environment as clap reads them. A refused value exits
    /// with clap's message, which names the flag and its range, and, when the value came from
    /// the flag's variable, the variable too.
    pub fn matches() -> ArgMatches {
        let argv: Vec<_> = std::env::args_os().collect();
        Cli::command()
            .try_get_matches_from(&argv)
            .unwrap_or_else(|e| name_the_variable(e, &argv).exit())
    }
}

/// Adds to clap's error for a refused value the `TARQ_` variable it came from, if it came from
/// one (the variable is set and the flag is not on the command line).
fn name_the_variable(mut error: clap::Error, argv: &[std::ffi::OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    // `--max-connections <N>`, `--null [<BOOL>]`: the flag's long name.
    let long = arg
        .trim_start_matches("--")
        .split([' ', '='])
        .next()
        .unwrap_or_default()
        .to_owned();
    let cmd = Cli::command();
    let Some(var) = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(long.as_str()))
        .and_then(|a| a.get_env())
    else {
        return error;
    };
    let flag = format!("--{long}");
    let on_the_line = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    if on_the_line || std::env::var_os(var).is_none() {
        return error;
    }
    let tip = format!(
        "the value comes from {} in the environment",
        var.to_string_lossy()
    );
    error.insert(
        ContextKind::Suggested,
        ContextValue::StyledStrs(vec![tip.into()]),
    );
    error
}

/// Every setting of the server, once: its flag (clap, with its `TARQ_` variable) and its key in
/// the `--config` file (serde, the flag's name). All optional: an absent one is left to the
/// layer below, and in the end to the default [`Config`] names. Values on the command line and
/// in the environment are checked by their parser here; the file's, by [`Config::validate`].
#[derive(Debug, Clone, Default, PartialEq, Args, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    /// Address to listen on [default: 127.0.0.1:3301].
    #[arg(long, env = "TARQ_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Directory for the queue's data files (created if missing) [default: ./data].
    #[arg(long, env = "TARQ_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Pin the event-loop thread to this CPU core (unpinned when absent).
    #[arg(long, env = "TARQ_CPU", value_name = "N", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub cpu: Option<usize>,

    /// When the loop has nothing to do, poll without blocking for up to this many
    /// microseconds before it sleeps, so a request arriving meanwhile is served without a
    /// wake-up (tens of µs on a VM). Spends the CPU it waits with: for a loop pinned with
    /// --cpu to a core of its own; 0: off [default: 0].
    #[arg(long, env = "TARQ_BUSY_POLL", value_name = "MICROS", value_parser = whole::<u64>(0, MAX_BUSY_POLL_MICROS), allow_negative_numbers = true)]
    pub busy_poll: Option<u64>,

    /// Most simultaneous client connections; more are refused with an error [default: 1000].
    #[arg(long, env = "TARQ_MAX_CONNECTIONS", value_name = "N", value_parser = whole::<usize>(1, MAX_CONNECTIONS_LIMIT as u64), allow_negative_numbers = true)]
    pub max_connections: Option<usize>,

    /// Largest request frame in bytes; a bigger one gets an error and the connection is closed
    /// [default: 16777216 (16 MiB)].
    #[arg(long, env = "TARQ_MAX_FRAME_BYTES", value_name = "BYTES", value_parser = whole::<usize>(MIN_FRAME_BYTES as u64, u64::from(u32::MAX)), allow_negative_numbers = true)]
    pub max_frame_bytes: Option<usize>,

    /// Most unread reply bytes held for one connection before it is disconnected; at least twice
    /// --max-frame-bytes [default: 33554432 (32 MiB), or twice --max-frame-bytes if more].
    #[arg(long, env = "TARQ_MAX_WRITE_BACKLOG", value_name = "BYTES", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub max_write_backlog: Option<usize>,

    /// Most bytes all clients together may make the server hold in unfinished request frames;
    /// at the limit the connection holding the most is closed [default: a sixteenth of the
    /// memory, at most 1 GiB, at least twice --max-frame-bytes].
    #[arg(long, env = "TARQ_INPUT_BUDGET_BYTES", value_name = "BYTES", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub input_budget_bytes: Option<usize>,

    /// Seconds a request frame may take to arrive once its first byte has; 0: no limit
    /// [default: 30].
    #[arg(
        long,
        env = "TARQ_FRAME_TIMEOUT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub frame_timeout: Option<f64>,

    /// With --user: seconds a new connection has to authenticate; 0: no limit [default: 10].
    #[arg(
        long,
        env = "TARQ_AUTH_TIMEOUT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub auth_timeout: Option<f64>,

    /// Close a connection that has sent nothing for this many seconds (a take waiting for a
    /// task keeps it open); 0: never [default: 0].
    #[arg(
        long,
        env = "TARQ_IDLE_TIMEOUT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub idle_timeout: Option<f64>,

    /// Most simultaneous connections from one client address (clients and /metrics together);
    /// 0: no limit [default: 0].
    #[arg(long, env = "TARQ_MAX_CONNECTIONS_PER_PEER", value_name = "N", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub max_connections_per_peer: Option<usize>,

    /// Longest grace a client may give its sessions with `queue.cfg{ttr = N}` (how long a
    /// disconnected session's taken tasks stay taken); a longer one is refused with an error
    /// naming this limit [default: 86400 (a day)].
    #[arg(
        long,
        env = "TARQ_MAX_SESSION_GRACE",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub max_session_grace: Option<f64>,

    /// Most sessions waiting out their grace at once; past it the one whose grace ends first
    /// is released to make room [default: 100000].
    #[arg(long, env = "TARQ_MAX_DETACHED_SESSIONS", value_name = "N", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub max_detached_sessions: Option<usize>,

    /// Most live tasks in the queue; a put past it is refused with an error naming the limit
    /// [default: 268435454, the most the queue can address].
    #[arg(long, env = "TARQ_MAX_TASKS", value_name = "N", value_parser = whole::<usize>(1, MAX_TASKS as u64), allow_negative_numbers = true)]
    pub max_tasks: Option<usize>,

    /// A sharded cluster's partition moves from this node copy at most this many tasks a
    /// second, so the clients of the node and of the new owner keep their pace (0: no limit)
    /// [default: 200000].
    #[arg(long, env = "TARQ_MOVE_RATE", value_name = "TASKS", value_parser = whole::<u64>(0, u64::MAX), allow_negative_numbers = true)]
    pub move_rate: Option<u64>,

    /// A sharded cluster's link to another set's primary is taken for dead after this many
    /// seconds without a byte from it (it is pinged after a quarter of that in silence) or
    /// without its greeting once connecting; its calls in flight are then answered (code 1003
    /// for those sent, 7 for those not) and the next call opens a new link; 0: never
    /// [default: 5].
    #[arg(
        long,
        env = "TARQ_LINK_TIMEOUT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub link_timeout: Option<f64>,

    /// A sharded cluster's router keeps at most this many of each kind of waiting call: calls
    /// forwarded to other sets and not answered yet, calls held while their partition moves (or
    /// is held for a drop) or until a placement read is applied, takes waiting across
    /// partitions. One more is refused
    /// (nothing done) with a message naming the limit [default: 100000].
    #[arg(long, env = "TARQ_MAX_ROUTED_CALLS", value_name = "N", value_parser = whole::<usize>(1, u64::MAX), allow_negative_numbers = true)]
    pub max_routed_calls: Option<usize>,

    /// Log level: error, warn, info, debug or trace [default: info].
    #[arg(long, env = "TARQ_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,

    /// Also serve beanstalkd's text protocol (version 1.12) on this address, over the same
    /// queue and tubes [default: off].
    #[arg(long, env = "TARQ_BEANSTALK_LISTEN", value_name = "ADDR")]
    pub beanstalk_listen: Option<SocketAddr>,

    /// Largest job body a beanstalk `put` may carry; a bigger one gets JOB_TOO_BIG (beanstalkd's
    /// -z) [default: 65535].
    #[arg(long, env = "TARQ_BEANSTALK_MAX_JOB_SIZE", value_name = "BYTES", value_parser = whole::<u32>(0, u64::from(u32::MAX)), allow_negative_numbers = true)]
    pub beanstalk_max_job_size: Option<u32>,

    /// With --user: the user the beanstalk port acts as (beanstalkd has no login), checked
    /// against its grants; a tube it may not touch is answered as a missing one. Without it
    /// the beanstalk port may do everything, as before users existed.
    #[arg(long, env = "TARQ_BEANSTALK_USER", value_name = "NAME")]
    pub beanstalk_user: Option<String>,

    /// With --user: most connections one user may hold at once (IPROTO connections
    /// authenticated as it, and the beanstalk port's when it acts as it); one more is refused
    /// when it authenticates, with an error naming this limit. The bootstrap administrator
    /// (and so the cluster's own nodes) is never limited; 0: no limit [default: 0].
    #[arg(long, env = "TARQ_USER_MAX_CONNECTIONS", value_name = "N", value_parser = whole::<usize>(0, u64::MAX), allow_negative_numbers = true)]
    pub user_max_connections: Option<usize>,

    /// With --user: most puts a second one user may make over all its connections, after a
    /// burst of one second's worth. A put over it is not refused: its answer is delayed, and
    /// its connection not read, until the user is back within the rate. The bootstrap
    /// administrator is never limited; 0: no limit [default: 0].
    #[arg(long, env = "TARQ_USER_PUT_RATE", value_name = "PUTS", value_parser = whole::<u64>(0, MAX_USER_PUT_RATE), allow_negative_numbers = true)]
    pub user_put_rate: Option<u64>,

    /// Namespace of the tarantool/queue API: its calls are `<NS>.create_tube`,
    /// `<NS>.tube.<name>:<method>`, ... (some clients use `box.queue`) [default: queue].
    #[arg(long, env = "TARQ_QUEUE_NAMESPACE", value_name = "NS")]
    pub queue_namespace: Option<String>,

    /// Require clients to authenticate as this user (chap-sha1) before calling anything; its
    /// password comes from --password or --password-file.
    #[arg(long, env = "TARQ_USER", value_name = "NAME")]
    pub user: Option<String>,

    /// The password of --user. On a shared machine prefer --password-file or TARQ_PASSWORD:
    /// any local user can read a command line.
    #[arg(
        long,
        env = "TARQ_PASSWORD",
        hide_env_values = true,
        value_name = "SECRET"
    )]
    pub password: Option<String>,

    /// A file holding the password of --user (one trailing newline is not part of it), read at
    /// start and again on every reload (SIGHUP).
    #[arg(long, env = "TARQ_PASSWORD_FILE", value_name = "FILE")]
    pub password_file: Option<PathBuf>,

    /// TLS on the IPROTO port (--listen): off, optional (TLS for clients that start it, plain
    /// for the others, whose greeting waits --tls-hello-wait) or required (a plain client is
    /// refused) [default: off]. Needs --tls-cert and --tls-key.
    #[arg(long, env = "TARQ_LISTEN_TLS", value_name = "MODE")]
    #[serde(default, deserialize_with = "from_text")]
    pub listen_tls: Option<TlsMode>,

    /// TLS on the beanstalk port: off, optional or required [default: off].
    #[arg(long, env = "TARQ_BEANSTALK_TLS", value_name = "MODE")]
    #[serde(default, deserialize_with = "from_text")]
    pub beanstalk_tls: Option<TlsMode>,

    /// TLS on the HTTP port (https://): off, optional or required [default: off].
    #[arg(long, env = "TARQ_HTTP_TLS", value_name = "MODE")]
    #[serde(default, deserialize_with = "from_text")]
    pub http_tls: Option<TlsMode>,

    /// The server's certificate chain (PEM, its own certificate first), read at start and again
    /// on every reload (SIGHUP); connections already open keep theirs.
    #[arg(long, env = "TARQ_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1), read with it.
    #[arg(long, env = "TARQ_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// The CA that signs the cluster's nodes (PEM). With it, replication and shard links go over
    /// TLS with mutual authentication: this node shows --tls-cert to the nodes it connects to
    /// and checks theirs against this CA, and a JOIN, SUBSCRIBE or link reaching it is refused
    /// unless it came over TLS with a certificate this CA signed. Needs --listen-tls.
    #[arg(long, env = "TARQ_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// On an IPROTO port with TLS optional or required: seconds a new connection has to start
    /// TLS (its ClientHello) before it is taken for a plain client, which gets its greeting
    /// then (optional) or a refusal (required) [default: 0.2].
    #[arg(
        long,
        env = "TARQ_TLS_HELLO_WAIT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub tls_hello_wait: Option<f64>,

    /// Run as a read-only replica of the tarq primary at this address: join it (a snapshot,
    /// then its WAL records as they are written), apply and log what it writes, and refuse
    /// changes with an error naming it [default: off, this tarq is a primary].
    #[arg(long, env = "TARQ_REPLICA_OF", value_name = "ADDR")]
    pub replica_of: Option<SocketAddr>,

    /// Synchronous replication: answer a change (put, ack, release, ...) only once this many
    /// replicas have it durably in their own WAL (Tarantool's replication_synchro_quorum,
    /// counting replicas, not the primary) [default: 0, asynchronous].
    #[arg(long, env = "TARQ_SYNC_REPLICAS", value_name = "N", value_parser = whole::<usize>(0, MAX_SYNC_REPLICAS as u64), allow_negative_numbers = true)]
    pub sync_replicas: Option<usize>,

    /// How long a change waits for --sync-replicas acknowledgements before its client gets
    /// ER_SYNC_QUORUM_TIMEOUT; the change stays applied and keeps replicating, as with
    /// Tarantool's replication_synchro_timeout in its new behaviour [default: 5].
    #[arg(
        long,
        env = "TARQ_SYNC_TIMEOUT",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub sync_timeout: Option<f64>,

    /// Fail over through etcd: every node campaigns for a lease-backed leader key under
    /// /tarq/<cluster>/; the leader is the primary, the others replicate it. Comma-separated
    /// client URLs, http://host:port or https://host:port (with --etcd-ca) [default: off].
    /// Needs --cluster and --node-name.
    #[arg(long, env = "TARQ_ETCD", value_name = "URLS", value_delimiter = ',')]
    pub etcd: Option<Vec<String>>,

    /// The CA that signed etcd's certificate (PEM), for https:// --etcd endpoints.
    #[arg(long, env = "TARQ_ETCD_CA", value_name = "FILE")]
    pub etcd_ca: Option<PathBuf>,

    /// This node's client certificate for etcd (PEM), when etcd runs with --client-cert-auth.
    #[arg(long, env = "TARQ_ETCD_CERT", value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key of --etcd-cert (PEM).
    #[arg(long, env = "TARQ_ETCD_KEY", value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,

    /// The cluster's name in etcd (with --etcd).
    #[arg(long, env = "TARQ_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,

    /// This node's name in the cluster, unique (with --etcd).
    #[arg(long, env = "TARQ_NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,

    /// The replica set this node belongs to (with --etcd): a sharded cluster is several sets,
    /// each electing its own primary under /tarq/<cluster>/sets/<NAME>/, and tubes are placed
    /// over them. 1 to 64 bytes of A-Z a-z 0-9 . _ -; "default" is the set of the unsharded
    /// keys [default: none, unsharded].
    #[arg(long, env = "TARQ_REPLICA_SET", value_name = "NAME")]
    pub replica_set: Option<String>,

    /// The address other nodes and clients reach this node's IPROTO port at (with --etcd)
    /// [default: the --listen address].
    #[arg(long, env = "TARQ_ADVERTISE", value_name = "ADDR")]
    pub advertise: Option<SocketAddr>,

    /// Lease TTL in whole seconds (with --etcd): how long a dead primary keeps its role
    /// before another node may take over [default: 3].
    #[arg(long, env = "TARQ_LEASE_TTL", value_name = "SECONDS", value_parser = lease_ttl_secs, allow_negative_numbers = true)]
    pub lease_ttl: Option<u64>,

    /// Benchmark mode: answer every CALL at once with an empty result, without the queue
    /// (--null=false turns off a `null = true` of the file).
    #[arg(long, env = "TARQ_NULL", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub null: Option<bool>,

    /// Push stats to Graphite's plaintext port every --graphite-interval, as lines
    /// `queue.stats.<name> <value> <unix_seconds>`: tcp://HOST:PORT or udp://HOST:PORT
    /// [default: off].
    #[arg(long, env = "TARQ_GRAPHITE", value_name = "URL")]
    pub graphite: Option<String>,

    /// Seconds between Graphite pushes [default: 1].
    #[arg(
        long,
        env = "TARQ_GRAPHITE_INTERVAL",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub graphite_interval: Option<f64>,

    /// Serve the web console on this address: the dashboard at http://ADDR/, the JSON API
    /// under /api/ and Prometheus metrics at /metrics. A port alone (9100) is on 127.0.0.1.
    /// With --user/--password every page but /metrics asks for them; without, the console is
    /// read-only. Keep it on a loopback or trusted address [default: off].
    #[arg(long, env = "TARQ_HTTP_LISTEN", value_name = "ADDR|PORT", value_parser = loopback_or_addr)]
    #[serde(default, deserialize_with = "addr_or_port")]
    pub http_listen: Option<SocketAddr>,

    /// The names clients reach the HTTP port by (comma-separated; a port after a name is
    /// ignored). A request whose Host header names another is refused: a page of another site
    /// could otherwise reach the console by pointing its own name at this address (DNS
    /// rebinding). IP addresses, `localhost` and names without a dot are always served. Without
    /// names, a port on a loopback address serves only those, one on a network address any
    /// name (and the start warns) [default: none].
    #[arg(
        long,
        env = "TARQ_HTTP_HOST",
        value_name = "NAMES",
        value_delimiter = ','
    )]
    pub http_host: Option<Vec<String>>,

    /// Ask for a user at /metrics too (HTTP Basic, as every other page: the --user, or a
    /// stored user with a right on some tube); Prometheus sends one with `basic_auth`. Without
    /// it /metrics is open to whoever reaches the port [default: false].
    #[arg(long, env = "TARQ_METRICS_AUTH", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub metrics_auth: Option<bool>,

    /// The old name of --http-listen (the port served /metrics only, and still does).
    #[arg(long, env = "TARQ_METRICS_LISTEN", value_name = "ADDR|PORT", value_parser = loopback_or_addr)]
    #[serde(default, deserialize_with = "addr_or_port")]
    pub metrics_listen: Option<SocketAddr>,

    /// When a change counts as durable: none (no WAL, snapshots only), write (written to the
    /// OS: survives a crash of tarq) or fsync (synced: survives a power loss) [default: write].
    #[arg(long, env = "TARQ_WAL_MODE", value_name = "MODE")]
    #[serde(default, deserialize_with = "from_text")]
    pub wal_mode: Option<WalMode>,

    /// Start even when a WAL file is damaged (anything but a torn tail) or every snapshot is:
    /// skip the damage and log what was lost (otherwise such a start stops with an error
    /// naming the file and offset; a replica copies its primary again instead).
    #[arg(long, env = "TARQ_FORCE_RECOVERY", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub force_recovery: Option<bool>,

    /// Take a snapshot once this many bytes of WAL were written since the last one (counted
    /// from the files, so across restarts), and at least as much as the last snapshot's size;
    /// 0: no size trigger (`queue.snapshot()` and --snapshot-interval still work)
    /// [default: 268435456 (256 MiB)].
    #[arg(long, env = "TARQ_SNAPSHOT_EVERY_BYTES", value_name = "BYTES", value_parser = whole::<u64>(0, u64::MAX), allow_negative_numbers = true)]
    pub snapshot_every_bytes: Option<u64>,

    /// Start a new WAL segment file past this size (Tarantool's wal_max_size): the WAL a
    /// snapshot makes obsolete is removed a whole segment at a time
    /// [default: 67108864 (64 MiB)].
    #[arg(long, env = "TARQ_WAL_SEGMENT_BYTES", value_name = "BYTES", value_parser = whole::<u64>(4096, u64::MAX), allow_negative_numbers = true)]
    pub wal_segment_bytes: Option<u64>,

    /// Snapshots to keep (with the WAL the oldest of them needs) [default: 2].
    #[arg(long, env = "TARQ_KEEP_SNAPSHOTS", value_name = "N", value_parser = whole::<usize>(1, u64::MAX), allow_negative_numbers = true)]
    pub keep_snapshots: Option<usize>,

    /// Also take a snapshot this many seconds after the last one, if anything was written
    /// since (Tarantool's checkpoint_interval); 0: off [default: 0].
    #[arg(
        long,
        env = "TARQ_SNAPSHOT_INTERVAL",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub snapshot_interval: Option<f64>,
}

/// Subcommands of the binary.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Talk to a running tarq: put, take, ack, release, delete, touch, stats, tubes, the
    /// cluster, or an interactive console.
    #[command(version)]
    Ctl(CtlArgs),
}

/// A setting given in the file as text and parsed as on the command line (`wal-mode`); the
/// parser's message lands in the file's error, at the key's line.
fn from_text<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: std::str::FromStr<Err = String>,
{
    match Option::<String>::deserialize(de)? {
        None => Ok(None),
        Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
    }
}

/// An address, or a port alone on 127.0.0.1: the HTTP port binds the loopback unless told
/// otherwise.
fn loopback_or_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("{s:?} is neither an address (127.0.0.1:9100) nor a port (9100)"))
}

/// [`loopback_or_addr`] for the config file: a string, or a port as a number.
fn addr_or_port<'de, D>(de: D) -> Result<Option<SocketAddr>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Port(u16),
        Addr(String),
    }
    match Option::<Text>::deserialize(de)? {
        None => Ok(None),
        Some(Text::Port(p)) => Ok(Some(SocketAddr::from(([127, 0, 0, 1], p)))),
        Some(Text::Addr(a)) => loopback_or_addr(&a)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// A user allowed to authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

/// Log levels accepted by `--log-level`.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// The resolved configuration the server runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub cpu: Option<usize>,
    /// How long an idle loop polls without blocking before it sleeps (µs; 0: off).
    pub busy_poll: Micros,
    pub max_connections: usize,
    pub max_frame_bytes: usize,
    pub max_write_backlog: usize,
    /// The input budget, deadlines and per-address cap.
    pub limits: LimitsConfig,
    /// The longest `queue.cfg{ttr}` a client may set (µs).
    pub max_session_grace: Micros,
    /// Sessions kept waiting out their grace at once.
    pub max_detached_sessions: usize,
    /// Live tasks past which a put is refused.
    pub max_tasks: usize,
    /// Tasks a second a partition move copies (0: no limit).
    pub move_rate: u64,
    /// Silence after which a link to another set is taken for dead (µs; 0: never).
    pub link_timeout: Micros,
    /// Waiting calls of each kind the router keeps at most.
    pub max_routed_calls: usize,
    pub log_level: String,
    /// The tarantool/queue API's namespace (`queue`).
    pub queue_namespace: String,
    /// The beanstalk port, if served.
    pub beanstalk_listen: Option<SocketAddr>,
    /// The HTTP port (web console, JSON API, `/metrics`), if served.
    pub http_listen: Option<SocketAddr>,
    /// The names the HTTP port answers (`Host`), as given.
    pub http_hosts: Vec<String>,
    /// Whether /metrics asks for a user (with `auth`).
    pub metrics_auth: bool,
    /// The largest beanstalk job body.
    pub beanstalk_max_job_size: u32,
    /// The user the beanstalk port acts as (with `auth`); `None`: every right.
    pub beanstalk_user: Option<String>,
    /// Connections one user may hold (0: no limit; the bootstrap administrator has none).
    pub user_max_connections: usize,
    /// Puts a second one user may make, after a second's worth at once (0: no limit).
    pub user_put_rate: u64,
    /// The bootstrap administrator (`--user`): with it, users and grants are checked.
    pub auth: Option<Credentials>,
    /// The primary this tarq replicates (read-only while set).
    pub replica_of: Option<SocketAddr>,
    /// Replicas that must have a change durably before it is answered (0: asynchronous).
    pub sync_replicas: usize,
    /// How long a change waits for them (µs).
    pub sync_timeout: Micros,
    /// Failover through etcd, when set.
    pub cluster: Option<ClusterConfig>,
    pub null: bool,
    /// Graphite push and Prometheus metrics.
    pub ops: OpsConfig,
    /// WAL, snapshots and recovery.
    pub wal: WalConfig,
    /// TLS on the client ports.
    pub tls: TlsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("the default address parses"),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            cpu: None,
            busy_poll: 0,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_write_backlog: DEFAULT_MAX_WRITE_BACKLOG,
            limits: LimitsConfig::with_frame_cap(DEFAULT_MAX_FRAME_BYTES),
            max_session_grace: DEFAULT_MAX_SESSION_GRACE,
            max_detached_sessions: DEFAULT_MAX_DETACHED_SESSIONS,
            max_tasks: MAX_TASKS,
            move_rate: 200_000,
            link_timeout: 5_000_000,
            max_routed_calls: 100_000,
            log_level: "info".into(),
            queue_namespace: "queue".into(),
            beanstalk_listen: None,
            http_listen: None,
            http_hosts: Vec::new(),
            metrics_auth: false,
            beanstalk_max_job_size: tarq_beanstalk::DEFAULT_MAX_JOB_SIZE,
            beanstalk_user: None,
            user_max_connections: 0,
            user_put_rate: 0,
            auth: None,
            replica_of: None,
            sync_replicas: 0,
            sync_timeout: DEFAULT_SYNC_TIMEOUT,
            cluster: None,
            null: false,
            ops: OpsConfig::default(),
            wal: WalConfig::default(),
            tls: TlsConfig::default(),
        }
    }
}

/// A configuration that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is part of the message and deliberately not a `source`: anyhow would print
    // it a second time as "Caused by", and a reload logs only the message.
    #[error("cannot read config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("bad config file {path}: {error}")]
    Parse {
        path: PathBuf,
        error: Box<toml::de::Error>,
    },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Reads the `--config` file (if any), lays the command line and the environment over it,
    /// fills in the defaults and checks the result. `matches` are [`Cli`]'s; a reload (SIGHUP)
    /// calls this again with the same ones, so only the file and a password file are read anew.
    pub fn load(matches: &ArgMatches) -> Result<Config, ConfigError> {
        let file = match matches.get_one::<PathBuf>("config") {
            Some(path) => load_file(path)?,
            None => Settings::default(),
        };
        // clap's own merge: every setting given on the command line or in the environment
        // replaces the file's, the others keep it.
        let mut s = file.clone();
        s.update_from_arg_matches(matches)
            .map_err(|e| invalid(e.to_string()))?;
        let auth = credentials(matches, &file, &s)?;
        // Without etcd a cluster name in the file is inert (kept there for later), while one
        // on the command line or in the environment is a mistake worth stopping for.
        let names_a_cluster = ["cluster", "node_name", "replica_set"]
            .iter()
            .any(|id| matches.contains_id(id));
        Config::resolve(s, auth, names_a_cluster)
    }

    /// The merged settings with the defaults filled in, then validated.
    fn resolve(
        s: Settings,
        auth: Option<Credentials>,
        names_a_cluster: bool,
    ) -> Result<Config, ConfigError> {
        let d = Config::default();
        let listen = s.listen.unwrap_or(d.listen);
        let cluster = cluster_config(&s, names_a_cluster, listen)?;
        let max_frame_bytes = s.max_frame_bytes.unwrap_or(d.max_frame_bytes);
        let cfg = Config {
            listen,
            data_dir: s.data_dir.unwrap_or(d.data_dir),
            cpu: s.cpu,
            busy_poll: s.busy_poll.unwrap_or(d.busy_poll),
            max_connections: s.max_connections.unwrap_or(d.max_connections),
            max_frame_bytes,
            // Unless set, the backlog follows a raised frame cap so one reply always fits.
            max_write_backlog: s
                .max_write_backlog
                .unwrap_or(d.max_write_backlog.max(2 * max_frame_bytes)),
            limits: LimitsConfig {
                input_budget: s
                    .input_budget_bytes
                    .unwrap_or_else(|| default_input_budget(max_frame_bytes)),
                frame_timeout: timeout("frame-timeout", s.frame_timeout, d.limits.frame_timeout)?,
                auth_timeout: timeout("auth-timeout", s.auth_timeout, d.limits.auth_timeout)?,
                idle_timeout: timeout("idle-timeout", s.idle_timeout, d.limits.idle_timeout)?,
                max_connections_per_peer: s
                    .max_connections_per_peer
                    .unwrap_or(d.limits.max_connections_per_peer),
            },
            max_session_grace: max_session_grace(s.max_session_grace)?,
            max_detached_sessions: s.max_detached_sessions.unwrap_or(d.max_detached_sessions),
            max_tasks: s.max_tasks.unwrap_or(d.max_tasks),
            move_rate: s.move_rate.unwrap_or(d.move_rate),
            link_timeout: timeout("link-timeout", s.link_timeout, d.link_timeout)?,
            max_routed_calls: s.max_routed_calls.unwrap_or(d.max_routed_calls),
            log_level: s.log_level.unwrap_or(d.log_level),
            queue_namespace: s.queue_namespace.unwrap_or(d.queue_namespace),
            beanstalk_listen: s.beanstalk_listen,
            http_listen: http_listen(s.http_listen, s.metrics_listen)?,
            http_hosts: s.http_host.unwrap_or_default(),
            metrics_auth: s.metrics_auth.unwrap_or(d.metrics_auth),
            beanstalk_max_job_size: s.beanstalk_max_job_size.unwrap_or(d.beanstalk_max_job_size),
            beanstalk_user: s.beanstalk_user,
            user_max_connections: s.user_max_connections.unwrap_or(d.user_max_connections),
            user_put_rate: s.user_put_rate.unwrap_or(d.user_put_rate),
            auth,
            replica_of: s.replica_of,
            sync_replicas: s.sync_replicas.unwrap_or(d.sync_replicas),
            sync_timeout: sync_timeout(s.sync_timeout)?,
            null: s.null.unwrap_or(d.null),
            ops: OpsConfig {
                graphite: match s.graphite {
                    Some(url) => Some(url.parse::<Target>().map_err(|e| invalid(e.to_string()))?),
                    None => None,
                },
                graphite_interval: graphite_interval(s.graphite_interval)?,
            },
            wal: WalConfig {
                mode: s.wal_mode.unwrap_or(d.wal.mode),
                force_recovery: s.force_recovery.unwrap_or(d.wal.force_recovery),
                snapshot_every_bytes: s.snapshot_every_bytes.unwrap_or(d.wal.snapshot_every_bytes),
                keep_snapshots: s.keep_snapshots.unwrap_or(d.wal.keep_snapshots),
                // A cluster node starts as a replica: taken tasks stay taken until it learns
                // whether it leads (then it releases them, as a restart does).
                replica: s.replica_of.is_some() || cluster.is_some(),
                segment_bytes: s.wal_segment_bytes.unwrap_or(d.wal.segment_bytes),
                snapshot_interval: snapshot_interval(s.snapshot_interval)?,
                loop_cpu: s.cpu,
            },
            cluster,
            tls: TlsConfig {
                iproto: s.listen_tls.unwrap_or_default(),
                beanstalk: s.beanstalk_tls.unwrap_or_default(),
                http: s.http_tls.unwrap_or_default(),
                files: match (s.tls_cert, s.tls_key) {
                    (Some(cert), Some(key)) => Some(TlsFiles {
                        cert,
                        key,
                        ca: s.tls_ca,
                    }),
                    (None, None) if s.tls_ca.is_some() => {
                        return Err(invalid(
                            "tls-ca needs tls-cert and tls-key: the certificate this node shows \
                             the others",
                        ))
                    }
                    (None, None) => None,
                    (Some(_), None) => {
                        return Err(invalid("tls-cert needs tls-key, its private key"))
                    }
                    (None, Some(_)) => {
                        return Err(invalid("tls-key needs tls-cert, its certificate"))
                    }
                },
                hello_wait: timeout("tls-hello-wait", s.tls_hello_wait, DEFAULT_TLS_HELLO_WAIT)?,
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the limits against each other; the error names the setting and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_replication()?;
        self.validate_wal()?;
        self.validate_names()?;
        self.validate_tls()?;
        self.validate_limits()
    }

    /// A port with TLS has a certificate to serve.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let t = &self.tls;
        let ports = [
            ("listen-tls", t.iproto),
            ("beanstalk-tls", t.beanstalk),
            ("http-tls", t.http),
        ];
        if t.files.as_ref().is_some_and(|f| f.ca.is_some()) && t.iproto == TlsMode::Off {
            return Err(invalid(
                "tls-ca needs listen-tls optional or required: the nodes' replication and links \
                 reach each other's IPROTO port",
            ));
        }
        for (name, mode) in ports {
            if mode != TlsMode::Off && t.files.is_none() {
                return Err(invalid(format!(
                    "{name} {mode} needs a certificate: set tls-cert and tls-key"
                )));
            }
        }
        Ok(())
    }

    /// `replica-of`, `sync-replicas` and `etcd` fit together and with the WAL.
    fn validate_replication(&self) -> Result<(), ConfigError> {
        if let Some(primary) = self.replica_of {
            if self.null {
                return Err(invalid(
                    "replica-of needs the queue: it cannot run with null",
                ));
            }
            if primary == self.listen {
                return Err(invalid(format!(
                    "replica-of {primary} is this tarq's own listen address: give the primary's"
                )));
            }
        }
        if self.sync_replicas > MAX_SYNC_REPLICAS {
            return Err(invalid(format!(
                "sync-replicas {} must be at most {MAX_SYNC_REPLICAS}",
                self.sync_replicas
            )));
        }
        if self.sync_replicas > 0 && self.wal.mode == tarq_wal::WalMode::None {
            return Err(invalid(
                "sync-replicas needs a WAL to stream: wal-mode none cannot have replicas; use \
                 wal-mode write or fsync",
            ));
        }
        if let Some(c) = &self.cluster {
            if self.replica_of.is_some() {
                return Err(invalid(
                    "replica-of and etcd exclude each other: in a cluster etcd names the primary",
                ));
            }
            if self.null || self.wal.mode == tarq_wal::WalMode::None {
                return Err(invalid(
                    "etcd needs a WAL to replicate: it cannot run with null or wal-mode none; use \
                     wal-mode write or fsync",
                ));
            }
            c.election
                .validate()
                .map_err(|e| invalid(format!("etcd: {e}")))?;
        }
        Ok(())
    }

    /// The WAL's segment and snapshot settings.
    fn validate_wal(&self) -> Result<(), ConfigError> {
        if self.wal.segment_bytes < 4096 {
            return Err(invalid(format!(
                "wal-segment-bytes {} must be at least 4096",
                self.wal.segment_bytes
            )));
        }
        if self.wal.keep_snapshots == 0 {
            return Err(invalid("keep-snapshots 0 must be at least 1"));
        }
        Ok(())
    }

    /// The log level and the queue's namespace.
    fn validate_names(&self) -> Result<(), ConfigError> {
        if !LOG_LEVELS.contains(&self.log_level.as_str()) {
            return Err(invalid(format!(
                "log-level '{}' is not one of {}",
                self.log_level,
                LOG_LEVELS.join(", ")
            )));
        }
        let ns = &self.queue_namespace;
        let word =
            |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ns.split('.').all(word) {
            return Err(invalid(format!(
                "queue-namespace '{ns}' must be names joined by dots, like queue or box.queue"
            )));
        }
        Ok(())
    }

    /// Connections, frames, jobs, backlogs and the input budget, each within what the others
    /// and the WAL allow.
    /// The settings about users (`metrics-auth`, `beanstalk-user`, the per-user limits): each
    /// needs `--user`, without which no connection acts as a user and nothing is checked.
    fn validate_user_settings(&self) -> Result<(), ConfigError> {
        if self.metrics_auth && self.auth.is_none() {
            return Err(invalid(
                "metrics-auth is set but user is not: without --user there is no user to ask \
                 for, and /metrics would stay open"
                    .to_owned(),
            ));
        }
        if let Some(u) = &self.beanstalk_user {
            if self.auth.is_none() {
                return Err(invalid(format!(
                    "beanstalk-user {u:?} is set but user is not: without --user nothing is \
                     checked, so the beanstalk port may do everything anyway"
                )));
            }
            tarq_engine::users::check_name(u)
                .map_err(|e| invalid(format!("beanstalk-user: {e}")))?;
        }
        let user_limits = [
            ("user-max-connections", self.user_max_connections as u64),
            ("user-put-rate", self.user_put_rate),
        ];
        for (name, value) in user_limits {
            if value > 0 && self.auth.is_none() {
                return Err(invalid(format!(
                    "{name} {value} is set but user is not: without --user no connection acts \
                     as a user, so nothing would be limited"
                )));
            }
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS_LIMIT {
            return Err(invalid(format!(
                "max-connections {} must be between 1 and {MAX_CONNECTIONS_LIMIT}",
                self.max_connections
            )));
        }
        if self.busy_poll > MAX_BUSY_POLL_MICROS {
            return Err(invalid(format!(
                "busy-poll {} must be between 0 and {MAX_BUSY_POLL_MICROS} microseconds",
                self.busy_poll
            )));
        }
        if self.max_frame_bytes < MIN_FRAME_BYTES || self.max_frame_bytes > u32::MAX as usize {
            return Err(invalid(format!(
                "max-frame-bytes {} must be between {MIN_FRAME_BYTES} and {}",
                self.max_frame_bytes,
                u32::MAX
            )));
        }
        if self.max_frame_bytes > tarq_wal::MAX_PAYLOAD_BYTES {
            return Err(invalid(format!(
                "max-frame-bytes {} is over the largest task the WAL holds ({} bytes)",
                self.max_frame_bytes,
                tarq_wal::MAX_PAYLOAD_BYTES
            )));
        }
        // A job is stored wrapped as one MessagePack string (at most 5 bytes of header).
        let job_limit = tarq_wal::MAX_PAYLOAD_BYTES.saturating_sub(5);
        if self.beanstalk_max_job_size as usize > job_limit {
            return Err(invalid(format!(
                "beanstalk-max-job-size {} is over the largest job the WAL holds ({job_limit} \
                 bytes)",
                self.beanstalk_max_job_size
            )));
        }
        self.validate_user_settings()?;
        if self.max_write_backlog < 2 * self.max_frame_bytes {
            return Err(invalid(format!(
                "max-write-backlog {} must be at least twice max-frame-bytes ({})",
                self.max_write_backlog, self.max_frame_bytes
            )));
        }
        if self.limits.input_budget < self.max_frame_bytes {
            return Err(invalid(format!(
                "input-budget-bytes {} must be at least max-frame-bytes ({}), or no maximal \
                 frame could ever arrive",
                self.limits.input_budget, self.max_frame_bytes
            )));
        }
        Ok(())
    }
}

/// Most `--sync-replicas`: more replicas than a cluster of this kind ever has is a typo.
pub const MAX_SYNC_REPLICAS: usize = 32;
/// Default `--sync-timeout`: Tarantool's replication_synchro_timeout default.
pub const DEFAULT_SYNC_TIMEOUT: Micros = 5_000_000;
/// Longest `--sync-timeout`: an hour; a change unanswered longer is a stuck client.
pub const MAX_SYNC_TIMEOUT_SECS: f64 = 3600.0;

/// `--sync-timeout` checked.
fn sync_timeout(secs: Option<f64>) -> Result<Micros, ConfigError> {
    match secs {
        None => Ok(DEFAULT_SYNC_TIMEOUT),
        Some(s) if s.is_finite() && s > 0.0 && s <= MAX_SYNC_TIMEOUT_SECS => {
            Ok((s * 1e6) as Micros)
        }
        Some(s) => Err(invalid(format!(
            "sync-timeout {s} must be above 0 and at most {MAX_SYNC_TIMEOUT_SECS} seconds"
        ))),
    }
}

/// A cluster node's settings: the election's, and this node's IPROTO address as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    pub election: tarq_cluster::Config,
}

/// `--etcd` with `--cluster`, `--node-name`, `--replica-set`, `--advertise`, `--lease-ttl`:
/// `None` without etcd.
/// `names_a_cluster`: `--cluster`, `--node-name` or `--replica-set` came from the command line
/// or environment.
fn cluster_config(
    s: &Settings,
    names_a_cluster: bool,
    listen: SocketAddr,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let endpoints = s.etcd.clone().unwrap_or_default();
    if endpoints.is_empty() {
        if names_a_cluster {
            return Err(invalid(
                "--cluster, --node-name and --replica-set only work with --etcd URL, the etcd \
                 that elects the cluster's primaries",
            ));
        }
        return Ok(None);
    }
    let cluster = s.cluster.clone().ok_or_else(|| {
        invalid(
            "--etcd needs --cluster NAME, the cluster's name in etcd (TOML: cluster = \"NAME\")",
        )
    })?;
    let name = s.node_name.clone().ok_or_else(|| {
        invalid(
            "--etcd needs --node-name NAME, this node's name, unique in the cluster \
             (TOML: node-name = \"NAME\")",
        )
    })?;
    let advertise = s.advertise.unwrap_or(listen);
    if advertise.ip().is_unspecified() || advertise.port() == 0 {
        return Err(invalid(format!(
            "advertise {advertise}: other nodes cannot reach it; set --advertise HOST:PORT"
        )));
    }
    let mut election =
        tarq_cluster::Config::new(endpoints, &cluster, &name, &advertise.to_string());
    election.replica_set = s.replica_set.clone();
    let client = match (s.etcd_cert.clone(), s.etcd_key.clone()) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(invalid("etcd-cert and etcd-key go together")),
    };
    election.tls = match (s.etcd_ca.clone(), client) {
        (Some(ca), client) => Some(tarq_cluster::EtcdTls { ca, client }),
        (None, None) => None,
        (None, Some(_)) => {
            return Err(invalid(
                "etcd-cert needs etcd-ca, the CA that signed etcd's certificate",
            ))
        }
    };
    if let Some(ttl) = s.lease_ttl {
        // Checked here too (the flag's parser checks it), for the value from the file.
        let (min, max) = lease_ttl_range();
        if !(min..=max).contains(&ttl) {
            return Err(invalid(format!(
                "lease-ttl {ttl} must be whole seconds from {min} to {max}"
            )));
        }
        election = election.with_lease_ttl(Duration::from_secs(ttl));
    }
    Ok(Some(ClusterConfig { election }))
}

/// Where a setting's value came from, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layer {
    Default,
    File,
    Environment,
    CommandLine,
}

impl Layer {
    /// The layer of the setting `id` (clap's id: the field's name), `in_file` if the file
    /// gives it.
    fn of(matches: &ArgMatches, id: &str, in_file: bool) -> Layer {
        match matches.value_source(id) {
            Some(ValueSource::CommandLine) => Layer::CommandLine,
            Some(ValueSource::EnvVariable) => Layer::Environment,
            _ if in_file => Layer::File,
            _ => Layer::Default,
        }
    }
}

/// `user` with its password. `password` and `password-file` are two spellings of one setting:
/// the higher layer's wins (`--password-file` over `TARQ_PASSWORD`), and a layer that gives
/// both is refused rather than one of them silently ignored.
fn credentials(
    matches: &ArgMatches,
    file: &Settings,
    s: &Settings,
) -> Result<Option<Credentials>, ConfigError> {
    let inline = Layer::of(matches, "password", file.password.is_some());
    let in_a_file = Layer::of(matches, "password_file", file.password_file.is_some());
    let both = match inline {
        _ if inline != in_a_file => None,
        Layer::Default => None,
        Layer::File => Some("in the config file (password, password-file)"),
        Layer::Environment => Some("in the environment (TARQ_PASSWORD, TARQ_PASSWORD_FILE)"),
        Layer::CommandLine => Some("on the command line (--password, --password-file)"),
    };
    if let Some(place) = both {
        return Err(invalid(format!(
            "the password is given twice {place}: give one"
        )));
    }
    let password = match &s.password_file {
        Some(path) if in_a_file > inline => Some(read_password(path)?),
        _ => s.password.clone(),
    };
    match (s.user.clone(), password) {
        (Some(user), Some(password)) => Ok(Some(Credentials { user, password })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(invalid(
            "user is set but password is not: set both (--password, --password-file, \
             TARQ_PASSWORD, or password in the config file)",
        )),
        (None, Some(_)) => Err(invalid(
            "password is set but user is not: set both (--user, TARQ_USER, or user in the \
             config file)",
        )),
    }
}

/// The password in `path`: the whole file but one trailing newline (`echo secret > file`
/// writes one that is not part of the password).
fn read_password(path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("cannot read password-file {}: {e}", path.display())))?;
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let password = line.strip_suffix('\r').unwrap_or(line);
    if password.is_empty() {
        return Err(invalid(format!(
            "password-file {} is empty; it must hold the password of --user",
            path.display()
        )));
    }
    Ok(password.to_owned())
}

/// The whole seconds `--lease-ttl` may be: the election's own limits.
fn lease_ttl_range() -> (u64, u64) {
    (
        tarq_cluster::MIN_LEASE_TTL.as_secs(),
        tarq_cluster::MAX_LEASE_TTL.as_secs(),
    )
}

/// `--lease-ttl`'s value parser: the range in seconds, as the check of the file's value says.
fn lease_ttl_secs(text: &str) -> Result<u64, String> {
    let (min, max) = lease_ttl_range();
    let range = || format!("must be whole seconds from {min} to {max}");
    let n: u64 = text.trim().parse().map_err(|_| range())?;
    (min..=max).contains(&n).then_some(n).ok_or_else(range)
}

/// A clap value parser for a whole number from `min` to `max`, whose error names the range
/// (`--max-connections -5`: "must be a whole number from 1 to 16777216"). The flags that use it
/// also set `allow_negative_numbers`, so a negative value reaches it instead of being taken
/// for an unknown flag.
fn whole<T>(min: u64, max: u64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync
where
    T: TryFrom<u64>,
{
    move |text: &str| {
        let range = || match max {
            u64::MAX => format!("must be a whole number, {min} or more"),
            _ => format!("must be a whole number from {min} to {max}"),
        };
        let n: u64 = text.trim().parse().map_err(|_| range())?;
        if !(min..=max).contains(&n) {
            return Err(range());
        }
        T::try_from(n).map_err(|_| range())
    }
}

/// Longest `--snapshot-interval`: a week; a snapshot rarer than that leaves recovery to the
/// size trigger anyway.
pub const MAX_SNAPSHOT_INTERVAL_SECS: f64 = 7.0 * 86_400.0;

/// `--snapshot-interval` checked: `None` for 0 or unset.
fn snapshot_interval(secs: Option<f64>) -> Result<Option<Duration>, ConfigError> {
    match secs {
        None => Ok(None),
        Some(0.0) => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s <= MAX_SNAPSHOT_INTERVAL_SECS => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(invalid(format!(
            "snapshot-interval {s} must be between 0 (off) and {MAX_SNAPSHOT_INTERVAL_SECS} seconds"
        ))),
    }
}

/// Longest `--graphite-interval`: a day; Graphite's retentions rarely keep anything coarser.
pub const MAX_GRAPHITE_INTERVAL_SECS: f64 = 86_400.0;

/// `http-listen`, or its old name `metrics-listen`; both at once must agree.
fn http_listen(
    http: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
) -> Result<Option<SocketAddr>, ConfigError> {
    match (http, metrics) {
        (Some(h), Some(m)) if h != m => Err(invalid(format!(
            "http-listen {h} and metrics-listen {m} differ: metrics-listen is the old name of \
             http-listen, give one"
        ))),
        (h, m) => Ok(h.or(m)),
    }
}

/// Longest `--frame-timeout`, `--auth-timeout` or `--idle-timeout`: a day; any longer is a
/// typo for "off", which is 0.
pub const MAX_TIMEOUT_SECS: f64 = 86_400.0;

/// A timeout setting in microseconds, checked; `default` when not given.
fn timeout(name: &str, secs: Option<f64>, default: u64) -> Result<u64, ConfigError> {
    let Some(secs) = secs else {
        return Ok(default);
    };
    if !(0.0..=MAX_TIMEOUT_SECS).contains(&secs) {
        return Err(invalid(format!(
            "{name} {secs} must be between 0 (off) and {MAX_TIMEOUT_SECS} seconds"
        )));
    }
    Ok((secs * 1e6).round() as u64)
}

/// Default `--max-session-grace`: a day. tarantool/queue takes any `ttr`; a day covers a
/// redeploy or a network outage, and a client asking more gets an error naming the limit.
pub const DEFAULT_MAX_SESSION_GRACE: Micros = 86_400_000_000;

/// Default `--max-detached-sessions`: each costs under 200 bytes here and in the engine's
/// session table, so the table stays under 20 MB, far above what reconnecting clients need.
pub const DEFAULT_MAX_DETACHED_SESSIONS: usize = 100_000;

/// Longest `--max-session-grace`: a year; the grace keeps a gone client's tasks from every
/// other consumer, and longer is a typo.
pub const MAX_SESSION_GRACE_SECS: f64 = 365.0 * 86_400.0;

/// `--max-session-grace` in microseconds, checked.
fn max_session_grace(secs: Option<f64>) -> Result<Micros, ConfigError> {
    match secs {
        None => Ok(DEFAULT_MAX_SESSION_GRACE),
        Some(s) if (0.0..=MAX_SESSION_GRACE_SECS).contains(&s) => Ok((s * 1e6).round() as Micros),
        Some(s) => Err(invalid(format!(
            "max-session-grace {s} must be between 0 (no grace) and {MAX_SESSION_GRACE_SECS} \
             seconds"
        ))),
    }
}

/// `--graphite-interval` in microseconds, checked.
fn graphite_interval(secs: Option<f64>) -> Result<u64, ConfigError> {
    let Some(secs) = secs else {
        return Ok(graphite::DEFAULT_INTERVAL);
    };
    let min = graphite::MIN_INTERVAL as f64 / 1e6;
    if !(min..=MAX_GRAPHITE_INTERVAL_SECS).contains(&secs) {
        return Err(invalid(format!(
            "graphite-interval {secs} must be between {min} and {MAX_GRAPHITE_INTERVAL_SECS} seconds"
        )));
    }
    Ok((secs * 1e6).round() as u64)
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

fn load_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
        path: path.to_owned(),
        error,
    })?;
    toml::from_str(&text).map_err(|error| ConfigError::Parse {
        path: path.to_owned(),
        error: Box::new(error),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["tarq"];
        argv.extend_from_slice(args);
        Config::load(&Cli::command().try_get_matches_from(argv).unwrap())
    }

    #[test]
    fn a_frame_limit_over_what_the_wal_holds_is_refused_naming_both() {
        let max = tarq_wal::MAX_PAYLOAD_BYTES;
        let backlog = (4 * max).to_string();
        let at = max.to_string();
        let ok = parse(&["--max-frame-bytes", &at, "--max-write-backlog", &backlog]);
        assert_eq!(ok.map(|c| c.max_frame_bytes).ok(), Some(max));
        let over = (max + 1).to_string();
        let err = parse(&["--max-frame-bytes", &over, "--max-write-backlog", &backlog])
            .expect_err("over the WAL's limit")
            .to_string();
        assert!(err.contains(&over) && err.contains(&at), "{err}");
    }

    #[test]
    fn per_user_limits_need_a_user_and_a_rate_in_range() {
        let locked = ["--user", "admin", "--password", "p"];
        let cfg = parse(&[&locked[..], &["--user-max-connections", "3"]].concat()).unwrap();
        assert_eq!((cfg.user_max_connections, cfg.user_put_rate), (3, 0));
        let cfg = parse(&[&locked[..], &["--user-put-rate", "500"]].concat()).unwrap();
        assert_eq!(cfg.user_put_rate, 500);
        for flag in ["--user-max-connections", "--user-put-rate"] {
            let err = parse(&[flag, "5"]).expect_err("no --user").to_string();
            assert!(
                err.contains(&flag[2..]) && err.contains("user is not"),
                "{err}"
            );
        }
        let over = (MAX_USER_PUT_RATE + 1).to_string();
        let argv = ["tarq", "--user-put-rate", over.as_str()];
        assert!(Cli::command().try_get_matches_from(argv).is_err());
    }

    #[test]
    fn snapshot_interval_from_flag_or_file_and_checked() {
        let cfg = parse(&["--snapshot-interval", "90"]).unwrap();
        assert_eq!(cfg.wal.snapshot_interval, Some(Duration::from_secs(90)));
        assert_eq!(
            parse(&["--snapshot-interval", "0"])
                .unwrap()
                .wal
                .snapshot_interval,
            None
        );
        assert_eq!(parse(&[]).unwrap().wal.snapshot_interval, None);
        let err = parse(&["--snapshot-interval=-1"])
            .expect_err("negative")
            .to_string();
        assert!(err.contains("snapshot-interval -1"), "{err}");
        let err = parse(&["--snapshot-interval", "1e9"])
            .expect_err("too long")
            .to_string();
        assert!(err.contains("snapshot-interval 1000000000"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(&path, "snapshot-interval = 3600\n").unwrap();
        let cfg = parse(&["--config", path.to_str().unwrap()]).unwrap();
        assert_eq!(cfg.wal.snapshot_interval, Some(Duration::from_secs(3600)));
    }

    #[test]
    fn no_arguments_give_the_defaults() {
        assert_eq!(parse(&[]).unwrap(), Config::default());
        assert_eq!(Config::default().listen.to_string(), "127.0.0.1:3301");
        assert_eq!(Config::default().max_frame_bytes, 16 << 20);
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:4000\"\nmax-connections = 7\nlog-level = \"debug\"\n\
             user = \"u\"\npassword = \"p\"\n",
        )
        .unwrap();
        let cfg = parse(&["--config", path.to_str().unwrap(), "--max-connections", "9"]).unwrap();
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:4000");
        assert_eq!(cfg.max_connections, 9);
        assert_eq!(cfg.log_level, "debug");
        assert_eq!(
            cfg.auth,
            Some(Credentials {
                user: "u".into(),
                password: "p".into()
            })
        );
        assert_eq!(cfg.data_dir, PathBuf::from("./data"));
    }

    #[test]
    fn tls_from_flag_or_file_needs_a_certificate_and_its_key() {
        let d = parse(&[]).unwrap().tls;
        assert!(!d.any() && d.files.is_none(), "off by default");
        assert_eq!(d.hello_wait, DEFAULT_TLS_HELLO_WAIT);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(
            &path,
            "listen-tls = \"required\"\nhttp-tls = \"optional\"\ntls-cert = \"/c.pem\"\n\
             tls-key = \"/k.pem\"\ntls-hello-wait = 0.5\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let t = parse(&["--config", file, "--beanstalk-tls", "optional"])
            .unwrap()
            .tls;
        assert_eq!(
            (t.iproto, t.beanstalk, t.http, t.hello_wait),
            (
                TlsMode::Required,
                TlsMode::Optional,
                TlsMode::Optional,
                500_000
            )
        );
        assert_eq!(t.files.unwrap().cert, PathBuf::from("/c.pem"));
        let e = parse(&["--listen-tls", "required"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("listen-tls required needs a certificate: set tls-cert and tls-key"),
            "{e}"
        );
        let e = parse(&["--tls-cert", "/c.pem"]).unwrap_err().to_string();
        assert!(e.contains("tls-cert needs tls-key"), "{e}");
        let e = parse(&["--tls-ca", "/ca.pem"]).unwrap_err().to_string();
        assert!(e.contains("tls-ca needs tls-cert and tls-key"), "{e}");
        let (cert, key) = ("/c.pem", "/k.pem");
        let e = parse(&["--tls-cert", cert, "--tls-key", key, "--tls-ca", "/ca.pem"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tls-ca needs listen-tls optional or required"),
            "{e}"
        );
        let c = parse(&[
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--tls-ca",
            "/ca.pem",
            "--listen-tls",
            "optional",
        ])
        .unwrap();
        assert_eq!(c.tls.files.unwrap().ca, Some(PathBuf::from("/ca.pem")));
        let e = refused(&["--http-tls", "yes"]);
        assert!(
            e.contains("not a TLS mode: off, optional or required"),
            "{e}"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(&path, "max-conections = 7\n").unwrap();
        let e = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-conections"), "{e}");
        let e = parse(&["--log-level", "loud"]).unwrap_err().to_string();
        assert!(e.contains("log-level 'loud'"), "{e}");
        let e = parse(&["--max-frame-bytes", "1000000", "--max-write-backlog", "10"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-write-backlog 10"), "{e}");
        std::fs::write(&path, "max-connections = 0\n").unwrap();
        let e = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-connections 0 must be between 1 and"), "{e}");
        let e = parse(&["--user", "u"]).unwrap_err().to_string();
        assert!(e.starts_with("user is set but password is not"), "{e}");
    }

    #[test]
    fn session_and_task_bounds_from_flag_or_file_and_checked() {
        let d = Config::default();
        assert_eq!(d.max_session_grace, 86_400_000_000, "a day");
        assert_eq!(d.max_tasks, tarq_engine::MAX_TASKS);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(
            &path,
            "max-session-grace = 60\nmax-detached-sessions = 5\nmax-tasks = 1000\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let c = parse(&["--config", file]).unwrap();
        assert_eq!(
            (c.max_session_grace, c.max_detached_sessions, c.max_tasks),
            (60_000_000, 5, 1000)
        );
        let c = parse(&[
            "--config",
            file,
            "--max-session-grace",
            "0.5",
            "--max-tasks",
            "7",
        ])
        .unwrap();
        assert_eq!((c.max_session_grace, c.max_tasks), (500_000, 7));
        let e = parse(&["--max-session-grace", "-1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max-session-grace -1 must be between 0"), "{e}");
        let e = refused(&["--max-tasks", "0"]);
        assert!(e.contains("--max-tasks <N>"), "{e}");
        let e = refused(&["--max-tasks", "268435455"]);
        assert!(e.contains("from 1 to 268435454"), "{e}");
    }

    #[test]
    fn busy_poll_from_flag_or_file_off_by_default_and_bounded() {
        assert_eq!(parse(&[]).unwrap().busy_poll, 0, "off by default");
        assert_eq!(parse(&["--busy-poll", "50"]).unwrap().busy_poll, 50);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(&path, "busy-poll = 200\n").unwrap();
        let file = path.to_str().unwrap();
        assert_eq!(parse(&["--config", file]).unwrap().busy_poll, 200);
        let c = parse(&["--config", file, "--busy-poll", "0"]).unwrap();
        assert_eq!(c.busy_poll, 0, "the command line turns the file's off");
        let e = refused(&["--busy-poll", "1000001"]);
        assert!(e.contains("'1000001' for '--busy-poll <MICROS>'"), "{e}");
        assert!(e.contains("from 0 to 1000000"), "{e}");
        assert!(refused(&["--busy-poll", "-1"]).contains("from 0 to 1000000"));
        std::fs::write(&path, "busy-poll = 2000000\n").unwrap();
        let e = parse(&["--config", file]).unwrap_err().to_string();
        assert!(
            e.contains("busy-poll 2000000 must be between 0 and 1000000 microseconds"),
            "{e}"
        );
    }

    /// The error clap gives for a command line, as the user reads it.
    fn refused(args: &[&str]) -> String {
        let mut argv = vec!["tarq"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .expect_err("the command line is refused")
            .to_string()
    }

    #[test]
    fn a_number_out_of_range_is_refused_naming_the_range() {
        let e = refused(&["--max-connections", "-5"]);
        assert!(
            e.contains(
                "'-5' for '--max-connections <N>': must be a whole number from 1 to 16777216"
            ),
            "{e}"
        );
        let e = refused(&["--max-connections", "0"]);
        assert!(e.contains("from 1 to 16777216"), "{e}");
        let e = refused(&["--sync-replicas", "99"]);
        assert!(e.contains("must be a whole number from 0 to 32"), "{e}");
        let e = refused(&["--lease-ttl", "0"]);
        assert!(e.contains("must be whole seconds from 2 to 60"), "{e}");
        let e = refused(&["--keep-snapshots", "many"]);
        assert!(e.contains("must be a whole number, 1 or more"), "{e}");
        // A negative number of seconds reaches the check that names the setting's range.
        let e = parse(&["--idle-timeout", "-1"]).unwrap_err().to_string();
        assert!(
            e.contains("idle-timeout -1 must be between 0 (off) and"),
            "{e}"
        );
    }

    #[test]
    fn etcd_settings_name_the_flag_that_is_missing() {
        let e = parse(&["--etcd", "http://127.0.0.1:2379"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--etcd needs --cluster NAME"), "{e}");
        let e = parse(&["--etcd", "http://127.0.0.1:2379", "--cluster", "c"])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--etcd needs --node-name NAME"), "{e}");
        for flags in [["--cluster", "c"], ["--replica-set", "s1"]] {
            let e = parse(&flags).unwrap_err().to_string();
            assert!(
                e.starts_with("--cluster, --node-name and --replica-set only work with --etcd"),
                "{e}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(
            &path,
            "etcd = [\"http://127.0.0.1:2379\"]\ncluster = \"c\"\nnode-name = \"n\"\nlease-ttl = 0\n",
        )
        .unwrap();
        let e = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "lease-ttl 0 must be whole seconds from 2 to 60");
        let etcd = [
            "--etcd",
            "http://127.0.0.1:2379",
            "--cluster",
            "c",
            "--node-name",
            "n",
        ];
        let e = parse(&[&etcd[..], &["--wal-mode", "none"]].concat())
            .unwrap_err()
            .to_string();
        assert!(e.ends_with("; use wal-mode write or fsync"), "{e}");
        std::fs::write(&path, "password = \"p\"\n").unwrap();
        let e = parse(&["--config", path.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("set both (--user, TARQ_USER, or user in the config file)"),
            "{e}"
        );
    }

    #[test]
    fn replica_set_reaches_the_election_from_flag_or_file_and_a_bad_name_is_named() {
        let etcd = [
            "--etcd",
            "http://127.0.0.1:2379",
            "--cluster",
            "c",
            "--node-name",
            "n",
            "--advertise",
            "127.0.0.1:3301",
        ];
        let c = parse(&etcd).unwrap().cluster.unwrap();
        assert_eq!(c.election.replica_set, None);
        assert!(!c.election.sharded());
        let c = parse(&[&etcd[..], &["--replica-set", "s1"]].concat())
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.election.replica_set.as_deref(), Some("s1"));
        assert!(c.election.sharded());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(&path, "replica-set = \"s2\"\n").unwrap();
        let file = ["--config", path.to_str().unwrap()];
        let c = parse(&[&etcd[..], &file[..]].concat())
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.election.replica_set.as_deref(), Some("s2"));
        // In the file without etcd it is inert, as cluster and node-name are.
        assert!(parse(&file).unwrap().cluster.is_none());
        let e = parse(&[&etcd[..], &["--replica-set", "a/b"]].concat())
            .unwrap_err()
            .to_string();
        assert!(e.contains("replica set name \"a/b\" must be"), "{e}");
        // The copy's pace, from the flag or the file.
        let c =
            parse(&[&etcd[..], &["--replica-set", "s1", "--move-rate", "5000"]].concat()).unwrap();
        assert_eq!(c.move_rate, 5000);
        assert_eq!(parse(&etcd).unwrap().move_rate, 200_000);
        assert_eq!(parse(&etcd).unwrap().link_timeout, 5_000_000);
        let c = parse(&[&etcd[..], &["--replica-set", "s1", "--link-timeout", "1.5"]].concat());
        assert_eq!(c.unwrap().link_timeout, 1_500_000);
        let e = parse(&[&etcd[..], &["--link-timeout", "-1"]].concat()).unwrap_err();
        assert!(
            e.to_string().contains("link-timeout -1 must be between"),
            "{e}"
        );
        // A sharded node serves the beanstalk port too.
        let sharded = [
            &etcd[..],
            &["--replica-set", "s1", "--beanstalk-listen", "127.0.0.1:0"],
        ];
        let c = parse(&sharded.concat()).unwrap();
        assert!(c.beanstalk_listen.is_some());
    }

    #[test]
    fn ops_settings_parse_and_bad_ones_are_named() {
        let cfg = parse(&[
            "--graphite",
            "udp://127.0.0.1:2003",
            "--graphite-interval",
            "0.5",
            "--metrics-listen",
            "127.0.0.1:9100",
        ])
        .unwrap();
        assert_eq!(
            cfg.ops.graphite.unwrap().to_string(),
            "udp://127.0.0.1:2003"
        );
        assert_eq!(cfg.ops.graphite_interval, 500_000);
        assert_eq!(cfg.http_listen, Some("127.0.0.1:9100".parse().unwrap()));
        let port = parse(&["--http-listen", "9100"]).unwrap();
        assert_eq!(port.http_listen, Some("127.0.0.1:9100".parse().unwrap()));
        let any = parse(&["--http-listen", "0.0.0.0:80"]).unwrap();
        assert_eq!(any.http_listen, Some("0.0.0.0:80".parse().unwrap()));
        let bad = refused(&["--http-listen", "nine"]);
        assert!(bad.contains("neither an address"), "{bad}");
        let both = parse(&[
            "--http-listen",
            "127.0.0.1:1",
            "--metrics-listen",
            "127.0.0.1:2",
        ]);
        assert!(both.unwrap_err().to_string().contains("differ"));
        assert_eq!(parse(&[]).unwrap().ops, OpsConfig::default());
        let e = parse(&["--graphite", "127.0.0.1:2003"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'127.0.0.1:2003' must start with tcp:// or udp://"),
            "{e}"
        );
        let e = parse(&["--graphite-interval", "0"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("graphite-interval 0 must be between"), "{e}");
        let cli = Cli::try_parse_from(["tarq", "ctl", "--addr", "127.0.0.1:1", "stats"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Ctl(_))));
    }

    /// A `--config` file holding `text` in a temporary directory, and the directory.
    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tarq.toml");
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap().to_owned();
        (dir, path)
    }

    #[test]
    fn the_http_port_is_a_port_on_the_loopback_or_an_address_in_the_file_too() {
        for (text, want) in [
            ("http-listen = 9100\n", "127.0.0.1:9100"),
            ("http-listen = \"9100\"\n", "127.0.0.1:9100"),
            ("http-listen = \"[::1]:9100\"\n", "[::1]:9100"),
            ("metrics-listen = \"0.0.0.0:9100\"\n", "0.0.0.0:9100"),
        ] {
            let (_dir, path) = file(text);
            let cfg = parse(&["--config", &path]).unwrap();
            assert_eq!(
                cfg.http_listen.map(|a| a.to_string()).as_deref(),
                Some(want),
                "{text}"
            );
        }
        let (_dir, path) = file("http-listen = \"somewhere\"\n");
        let e = parse(&["--config", &path]).unwrap_err().to_string();
        assert!(e.contains("neither an address"), "{e}");
    }

    #[test]
    fn a_yes_no_setting_of_the_file_is_turned_off_on_the_command_line() {
        let (_dir, path) = file("null = true\nforce-recovery = true\n");
        let cfg = parse(&["--config", &path]).unwrap();
        assert!(cfg.null && cfg.wal.force_recovery);
        for off in [
            &["--null=false", "--force-recovery=false"][..],
            &["--null", "false", "--force-recovery", "no"],
        ] {
            let cfg = parse(&[&["--config", path.as_str()][..], off].concat()).unwrap();
            assert!(!cfg.null && !cfg.wal.force_recovery, "{off:?}");
        }
        // The bare flag, with no value, turns it on.
        let cfg = parse(&["--null", "--force-recovery"]).unwrap();
        assert!(cfg.null && cfg.wal.force_recovery);
        assert!(!parse(&[]).unwrap().null);
    }

    #[test]
    fn every_setting_is_a_flag_a_tarq_variable_and_a_toml_key_of_one_name() {
        let cmd = Cli::command();
        let settings: Vec<_> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "config" | "help" | "version"))
            .collect();
        assert!(settings.len() > 30, "{}", settings.len());
        for arg in settings {
            let long = arg.get_long().expect("every setting is a long flag");
            let var = format!("TARQ_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(arg.get_env(), Some(std::ffi::OsStr::new(&var)), "--{long}");
            // A string is the wrong type for most keys, but only an unknown one says so.
            let err = toml::from_str::<Settings>(&format!("{long} = \"x\""))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!err.contains("unknown field"), "--{long}: {err}");
        }
    }

    #[test]
    fn the_password_comes_from_a_file_read_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("password");
        std::fs::write(&secret, "s3cret \n").unwrap();
        let secret = secret.to_str().unwrap();
        let want = Some(Credentials {
            user: "u".into(),
            password: "s3cret ".into(),
        });
        let cfg = parse(&["--user", "u", "--password-file", secret]).unwrap();
        assert_eq!(cfg.auth, want, "one trailing newline is cut, the rest kept");
        let (_d, path) = file(&format!("user = \"u\"\npassword-file = {secret:?}\n"));
        assert_eq!(parse(&["--config", &path]).unwrap().auth, want);
        // A higher layer's spelling wins over the file's other one, either way round.
        let cfg = parse(&["--config", &path, "--password", "flag"]).unwrap();
        assert_eq!(cfg.auth.unwrap().password, "flag");
        let (_d, path) = file("user = \"u\"\npassword = \"file\"\n");
        let cfg = parse(&["--config", &path, "--password-file", secret]).unwrap();
        assert_eq!(cfg.auth.unwrap().password, "s3cret ");
    }

    #[test]
    fn a_password_given_twice_or_unreadable_is_refused_naming_why() {
        let e = parse(&["--user", "u", "--password", "a", "--password-file", "/p"])
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "the password is given twice on the command line (--password, --password-file): \
             give one"
        );
        let (dir, path) = file("user = \"u\"\npassword = \"a\"\npassword-file = \"/p\"\n");
        let e = parse(&["--config", &path]).unwrap_err().to_string();
        assert!(e.contains("twice in the config file"), "{e}");
        let missing = dir.path().join("missing");
        let missing = missing.to_str().unwrap();
        let e = parse(&["--user", "u", "--password-file", missing])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "cannot read password-file {missing}: No such file"
            )),
            "{e}"
        );
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let e = parse(&["--user", "u", "--password-file", empty.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("is empty; it must hold the password of --user"),
            "{e}"
        );
    }
}
