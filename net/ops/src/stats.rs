//! The one list of figures an operator sees: [`Snapshot`] gathers the engine's [`Stats`], the
//! server's own counts and the WAL's figures, and [`Snapshot::metrics`] turns them into named
//! values. `queue.stats()` ([`Snapshot::write_msgpack`]), the Graphite push and the Prometheus
//! page all read that one list, so a figure added here shows up in all three with the same name.
//!
//! Gathering the figures is the loop's job (it owns the queue and the connections); this file
//! only names and encodes them.

use tarq_engine::{Micros, Stats};

use tarq_iproto::mp::write;

/// Figures the server keeps beside the engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerFigures {
    /// Client connections open now.
    pub connections: u64,
    /// Client connections accepted since start.
    pub connections_accepted: u64,
    /// `take(timeout)` requests waiting now.
    pub parked_takes: u64,
    /// `take(timeout)` requests that had to wait, since start.
    pub takes_parked: u64,
    /// Requests executed since start (every kind: calls, pings, auths, ...).
    pub requests: u64,
    /// Connections to the beanstalk port open now.
    pub beanstalk_connections: u64,
    /// beanstalk commands run since start.
    pub beanstalk_commands: u64,
    /// beanstalk requests refused by the protocol since start (BAD_FORMAT, UNKNOWN_COMMAND,
    /// EXPECTED_CRLF, JOB_TOO_BIG).
    pub beanstalk_errors: u64,
    /// beanstalk commands refused by the grants of `--beanstalk-user` since start (answered as
    /// a missing tube).
    pub beanstalk_refused: u64,
    /// IPROTO calls refused for want of a grant since start (ER_ACCESS_DENIED).
    pub access_denied: u64,
    /// A sharded cluster's moves this node runs as a partition's owner: running now (0 or 1),
    /// committed and given up since start, the tasks they moved, and the last committed
    /// one's length in milliseconds.
    pub moves_running: u64,
    pub moves_committed: u64,
    pub moves_given_up: u64,
    pub moved_tasks: u64,
    pub last_move_ms: u64,
    /// `tarq.link` calls refused since start: not of this cluster, without proof of its link
    /// key, or of another link protocol version.
    pub links_refused: u64,
    /// A sharded node's router now: calls forwarded and not answered, calls held for a move,
    /// a drop or a placement read, takes waiting across partitions; and calls refused at its bounds
    /// (`--max-routed-calls`, a link's unsent bytes) since start.
    pub routed_forwarded: u64,
    pub routed_held: u64,
    pub routed_waiting: u64,
    pub routed_refused: u64,
}

/// Figures of the limits on what clients may make the server hold (input budget, deadlines,
/// per-address cap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitFigures {
    /// Bytes of unfinished input held beyond the connections' resting buffers, now.
    pub input_bytes: u64,
    /// The input budget (`--input-budget-bytes`).
    pub input_budget: u64,
    pub frame_timeouts: u64,
    pub auth_timeouts: u64,
    pub idle_timeouts: u64,
    pub budget_evictions: u64,
    pub pre_auth_frames_refused: u64,
    pub peer_refusals: u64,
    pub http_timeouts: u64,
    /// Connections refused at a user's connection limit, and puts answered late for a
    /// user's put rate, since start (all users; per user in [`Snapshot::users`]).
    pub user_refusals: u64,
    pub puts_delayed: u64,
}

/// One user's figures under the per-user limits (`--user-max-connections`,
/// `--user-put-rate`): `/metrics` shows each as a series labelled with the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserFigures {
    pub name: String,
    /// Connections acting as this user now.
    pub connections: u64,
    /// Connections refused at its connection limit since start.
    pub refused: u64,
    /// Puts answered late for being over its put rate since start.
    pub puts_delayed: u64,
    /// How long its connections were muted for its put rate, since start (µs).
    pub delay: Micros,
}

/// Figures of the write-ahead log, when one is on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalFigures {
    /// Records appended since start.
    pub records: u64,
    /// Bytes appended since start.
    pub bytes: u64,
    /// 1 while the disk has no room for changes (they are refused at once), else 0.
    pub disk_full: u64,
    /// Changes refused since start because the disk had no room for them, or failed.
    pub refusals: u64,
    /// Bytes of disk allocated ahead of the log's written end now.
    pub allocated_ahead: u64,
}

/// Replication: the replicas streaming from this tarq, and, on a replica, how far behind its
/// primary it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicationFigures {
    /// Replicas connected to this tarq and streaming from it now.
    pub replicas: u64,
    /// Turns whose replies wait for `--sync-replicas` acknowledgements now.
    pub sync_waiting: u64,
    /// Turns whose replies timed out waiting for them, since start.
    pub sync_timeouts: u64,
    /// This tarq's side as a replica (`--replica-of`), if it is one.
    pub upstream: Option<UpstreamFigures>,
}

/// A replica's view of its primary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpstreamFigures {
    /// 1 while the stream from the primary is up.
    pub connected: u64,
    /// The last primary WAL record applied here.
    pub position: u64,
    /// Records the primary has written that are not applied here (as of its last word).
    pub lag_records: u64,
    /// Bytes of them: held for us at the primary, in flight to us, or received, not applied.
    pub lag_bytes: u64,
    /// How long ago the primary wrote what is applied here, while records are missing (0
    /// when caught up).
    pub lag_ms: u64,
    /// Times this replica joined from a snapshot since start.
    pub joins: u64,
}

/// One tube's figures at the instant of a [`Snapshot`]: a whole tube, or one partition of a
/// partitioned tube (several share its name on one node, so each is told by its number).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TubeFigures {
    pub name: String,
    /// `Some(p)` for partition `p` of a tube of several partitions; `None` for a tube of one,
    /// whose series stay as they were before shards.
    pub partition: Option<u16>,
    pub stats: Stats,
}

/// Everything the server reports, read at one instant of the loop. Cheap to build (a copy of a
/// few counters), so the loop builds one whenever a report is due.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The whole queue's figures: every tube's tasks, and the operations of every tube since
    /// start, dropped ones too (`Queue::all_stats`).
    pub engine: Stats,
    /// Each tube's figures (Graphite and Prometheus; `queue.statistics()` reads the engine).
    pub tubes: Vec<TubeFigures>,
    pub server: ServerFigures,
    pub limits: LimitFigures,
    /// The users under the per-user limits that have connected since start.
    pub users: Vec<UserFigures>,
    pub wal: Option<WalFigures>,
    pub replication: ReplicationFigures,
    /// `Queue::last_id()`: the seed API's ids (tube `default`'s) are a counter from 1 that
    /// survives restarts.
    pub last_id: u64,
    /// Time since the server started.
    pub uptime: Micros,
    /// The queue's clock (the wall clock, µs) when the figures were read: a tube's
    /// `ready_since` is on it.
    pub now: Micros,
}

/// How a figure behaves over time (Prometheus' `# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A level that goes up and down (tasks ready now).
    Gauge,
    /// A count since start that only grows.
    Counter,
}

/// One named figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// The key in `queue.stats()` and the last part of the Graphite path
    /// (`queue.stats.<name>`); Prometheus calls it `tarq_<name>` (plus `_total` for counters).
    pub name: &'static str,
    pub kind: Kind,
    /// One line for Prometheus' `# HELP`.
    pub help: &'static str,
    pub value: u64,
}

/// Figures before the WAL's; the seed's four counts come first, as `queue.stats()` had them.
const BASE_METRICS: usize = 34;

impl Snapshot {
    /// Every figure, in a stable order: the counts of now, then the counters since start, then
    /// the limits', then the WAL's (only when a WAL is on).
    pub fn metrics(&self) -> impl Iterator<Item = Metric> {
        use Kind::{Counter, Gauge};
        let (e, s) = (&self.engine, &self.server);
        let m = |name, kind, help, value| Metric {
            name,
            kind,
            help,
            value,
        };
        let base: [Metric; BASE_METRICS] = [
            m("total", Gauge, "Tasks in the queue now.", e.total),
            m("ready", Gauge, "Tasks ready to be taken now.", e.ready),
            m(
                "waiting",
                Gauge,
                "Delayed tasks waiting for their time now.",
                e.waiting,
            ),
            m(
                "taken",
                Gauge,
                "Tasks taken and not yet acked now.",
                e.taken,
            ),
            m(
                "connections",
                Gauge,
                "Client connections open now.",
                s.connections,
            ),
            m(
                "parked_takes",
                Gauge,
                "Takes waiting for a task now.",
                s.parked_takes,
            ),
            m("puts", Counter, "Tasks put since start.", e.puts),
            m("takes", Counter, "Tasks taken since start.", e.takes),
            m("acks", Counter, "Tasks acked since start.", e.acks),
            m(
                "releases",
                Counter,
                "Tasks released since start.",
                e.releases,
            ),
            m(
                "promoted",
                Counter,
                "Delayed tasks that became ready since start.",
                e.promoted,
            ),
            m(
                "expired",
                Counter,
                "Tasks deleted by their TTL since start.",
                e.expired,
            ),
            m(
                "ttr_returned",
                Counter,
                "Taken tasks returned to ready by their TTR since start.",
                e.ttr_returned,
            ),
            m(
                "auto_released",
                Counter,
                "Tasks returned to ready when their session closed, since start.",
                e.auto_released,
            ),
            m(
                "connections_accepted",
                Counter,
                "Client connections accepted since start.",
                s.connections_accepted,
            ),
            m(
                "takes_parked",
                Counter,
                "Takes that waited for a task, since start.",
                s.takes_parked,
            ),
            m(
                "requests",
                Counter,
                "Requests executed since start.",
                s.requests,
            ),
            m(
                "beanstalk_connections",
                Gauge,
                "Connections to the beanstalk port open now.",
                s.beanstalk_connections,
            ),
            m(
                "beanstalk_commands",
                Counter,
                "beanstalk commands run since start.",
                s.beanstalk_commands,
            ),
            m(
                "beanstalk_errors",
                Counter,
                "beanstalk requests refused by the protocol since start.",
                s.beanstalk_errors,
            ),
            m(
                "beanstalk_refused",
                Counter,
                "beanstalk commands refused by the grants of the port's user since start.",
                s.beanstalk_refused,
            ),
            m(
                "access_denied",
                Counter,
                "IPROTO calls refused for want of a grant since start.",
                s.access_denied,
            ),
            m(
                "moves_running",
                Gauge,
                "Partition moves this node runs as the owner now (0 or 1).",
                s.moves_running,
            ),
            m(
                "moves_committed",
                Counter,
                "Partition moves from this node committed since start.",
                s.moves_committed,
            ),
            m(
                "moves_given_up",
                Counter,
                "Partition moves from this node given up before their commit since start.",
                s.moves_given_up,
            ),
            m(
                "moved_tasks",
                Counter,
                "Tasks moved to other replica sets by committed moves since start.",
                s.moved_tasks,
            ),
            m(
                "links_refused",
                Counter,
                "Links refused since start: another cluster's, another link protocol version, or \
                 no proof of the cluster's link key.",
                s.links_refused,
            ),
            m(
                "routed_forwarded",
                Gauge,
                "Calls forwarded to other replica sets and not answered yet.",
                s.routed_forwarded,
            ),
            m(
                "routed_held",
                Gauge,
                "Calls held while their partition moves or is held for a drop, or until a \
                 placement read is applied.",
                s.routed_held,
            ),
            m(
                "routed_waiting",
                Gauge,
                "Takes waiting across the partitions of sharded tubes.",
                s.routed_waiting,
            ),
            m(
                "routed_refused",
                Counter,
                "Calls the router refused at its bounds (--max-routed-calls, a link's unsent \
                 bytes) since start.",
                s.routed_refused,
            ),
            m(
                "uptime_seconds",
                Gauge,
                "Seconds since the server started.",
                self.uptime / 1_000_000,
            ),
            // `default`'s ids are a counter from 1, so the last one is the number of seed puts
            // ever, across restarts: a cheap cross-check against `puts` (which counts since
            // start). Other tubes number their own tasks.
            m(
                "last_id",
                Gauge,
                "The highest task id the tube default has given out.",
                self.last_id,
            ),
            m(
                "wal_enabled",
                Gauge,
                "1 when a write-ahead log makes tasks durable, else 0.",
                u64::from(self.wal.is_some()),
            ),
        ];
        let l = &self.limits;
        let limits = [
            m(
                "input_bytes",
                Gauge,
                "Bytes of unfinished request frames held beyond resting buffers now.",
                l.input_bytes,
            ),
            m(
                "input_budget_bytes",
                Gauge,
                "The most bytes of unfinished request frames held at once (input-budget-bytes).",
                l.input_budget,
            ),
            m(
                "closed_frame_timeout",
                Counter,
                "Connections closed for not finishing a frame within frame-timeout, since start.",
                l.frame_timeouts,
            ),
            m(
                "closed_auth_timeout",
                Counter,
                "Connections closed for not authenticating within auth-timeout, since start.",
                l.auth_timeouts,
            ),
            m(
                "closed_idle",
                Counter,
                "Connections closed after idle-timeout without input, since start.",
                l.idle_timeouts,
            ),
            m(
                "closed_input_budget",
                Counter,
                "Connections closed to keep unfinished input within the budget, since start.",
                l.budget_evictions,
            ),
            m(
                "closed_pre_auth_frame",
                Counter,
                "Connections closed for a frame too big before authentication, since start.",
                l.pre_auth_frames_refused,
            ),
            m(
                "refused_per_peer",
                Counter,
                "Connections refused at max-connections-per-peer, since start.",
                l.peer_refusals,
            ),
            m(
                "closed_http_timeout",
                Counter,
                "HTTP clients closed for not finishing a request in time (frame-timeout), since start.",
                l.http_timeouts,
            ),
            m(
                "refused_per_user",
                Counter,
                "Connections refused at user-max-connections, since start.",
                l.user_refusals,
            ),
            m(
                "puts_delayed",
                Counter,
                "Puts answered late for their user's user-put-rate, since start.",
                l.puts_delayed,
            ),
        ];
        let wal = self.wal.map(|w| {
            [
                m(
                    "wal_records",
                    Counter,
                    "Records written to the WAL since start.",
                    w.records,
                ),
                m(
                    "wal_bytes",
                    Counter,
                    "Bytes written to the WAL since start.",
                    w.bytes,
                ),
                m(
                    "wal_disk_full",
                    Gauge,
                    "1 while the disk has no room for the WAL and changes are refused, else 0.",
                    w.disk_full,
                ),
                m(
                    "wal_refusals",
                    Counter,
                    "Changes refused since start because the disk had no room or failed.",
                    w.refusals,
                ),
                m(
                    "wal_allocated_ahead_bytes",
                    Gauge,
                    "Disk space allocated ahead of the WAL's written end now.",
                    w.allocated_ahead,
                ),
            ]
        });
        let r = &self.replication;
        let replicas = m(
            "replicas",
            Gauge,
            "Replicas streaming this tarq's WAL now.",
            r.replicas,
        );
        let sync = [
            m(
                "sync_waiting",
                Gauge,
                "Turns of changes waiting for --sync-replicas acknowledgements now.",
                r.sync_waiting,
            ),
            m(
                "sync_timeouts",
                Counter,
                "Turns of changes answered ER_SYNC_QUORUM_TIMEOUT since start.",
                r.sync_timeouts,
            ),
        ];
        let upstream = r.upstream.map(|u| {
            [
                m(
                    "replication_connected",
                    Gauge,
                    "1 while this replica's stream from its primary is up.",
                    u.connected,
                ),
                m(
                    "replication_position",
                    Gauge,
                    "The last primary WAL record applied by this replica.",
                    u.position,
                ),
                m(
                    "replication_lag_records",
                    Gauge,
                    "WAL records the primary wrote that this replica has not applied.",
                    u.lag_records,
                ),
                m(
                    "replication_lag_bytes",
                    Gauge,
                    "Bytes of WAL records the primary wrote that this replica has not applied.",
                    u.lag_bytes,
                ),
                m(
                    "replication_lag_ms",
                    Gauge,
                    "Milliseconds since the primary wrote what this replica applied, while behind.",
                    u.lag_ms,
                ),
                m(
                    "replication_joins",
                    Counter,
                    "Times this replica joined from its primary's snapshot, since start.",
                    u.joins,
                ),
            ]
        });
        base.into_iter()
            .chain(limits)
            .chain(wal.into_iter().flatten())
            .chain(std::iter::once(replicas))
            .chain(sync)
            .chain(upstream.into_iter().flatten())
    }

    /// `queue.stats()`: a MessagePack map of every figure, name → unsigned integer.
    pub fn write_msgpack(&self, out: &mut Vec<u8>) {
        write::map_len(out, self.metrics().count() as u32);
        for m in self.metrics() {
            write::str(out, m.name);
            write::uint(out, m.value);
        }
    }
}
