//! `stats`, `stats-job` and `stats-tube`: beanstalkd's YAML, filled from the engine's O(1)
//! counters and the front-end's own. Times are whole seconds, rounded down as beanstalkd
//! divides them.
//!
//! What the engine does not keep is said here rather than invented: a task carries its
//! delivery count (`reserves`) but not how often it timed out, was released, buried or kicked,
//! so those `stats-job` fields are 0; a job's `delay` is the delay it is still serving,
//! rounded up (the engine keeps when it wakes, not the delay asked for); `file` is 0 (the WAL does not track
//! which segment holds a job).

use tarq_beanstalk::{
    ok_yaml, CommandKind, CpuTime, JobState, Reply as Out, Stats, StatsJob, StatsTube,
};
use tarq_engine::{Micros, Status};

use super::{Beanstalk, Loop, Reply, SECOND};
use crate::core::{Command, Outcome, TaskFigures};
use crate::frontend::Then;

/// What this node keeps of a tube, read when its `stats-tube` is asked.
#[derive(Debug)]
pub struct TubeAsk {
    name: String,
    using: u64,
    watching: u64,
    waiting: u64,
    cmd_delete: u64,
    cmd_pause_tube: u64,
    pause: u64,
    pause_left: Micros,
}

/// `stats-tube`'s answer: the core's counts (`Command::TubeFigures`) with this node's figures.
pub(super) fn tube_answer(out: &mut Vec<u8>, asked: Option<Box<TubeAsk>>, outcome: &Outcome<'_>) {
    let (Some(a), Outcome::TubeFigures { stats: s, urgent }) = (asked, outcome) else {
        return super::encode(out, Reply::StatsTube, outcome);
    };
    let stats = StatsTube {
        name: &a.name,
        current_jobs_urgent: *urgent,
        current_jobs_ready: s.ready,
        current_jobs_reserved: s.taken,
        current_jobs_delayed: s.waiting,
        current_jobs_buried: s.buried,
        total_jobs: s.puts,
        current_using: a.using,
        current_watching: a.watching,
        current_waiting: a.waiting,
        cmd_delete: a.cmd_delete,
        cmd_pause_tube: a.cmd_pause_tube,
        pause: a.pause,
        pause_time_left: whole_secs(a.pause_left),
    };
    ok_yaml(out, |o| stats.write_yaml(o));
}

/// `stats-job`'s answer, from the figures of the node that holds the job.
pub(super) fn job_answer(out: &mut Vec<u8>, f: &TaskFigures) {
    let state = match f.status {
        Status::Waiting => JobState::Delayed,
        Status::Taken => JobState::Reserved,
        Status::Buried => JobState::Buried,
        Status::Ready => JobState::Ready,
    };
    let time_left = match f.status {
        Status::Waiting => f.delay_left,
        Status::Taken => f.ttr_left,
        _ => 0,
    };
    let stats = StatsJob {
        id: f.id,
        tube: &f.tube,
        state,
        pri: beanstalk_pri(f.pri),
        age: whole_secs(f.age),
        // Rounded up: right after `put` with a delay of N it reads N, as beanstalkd's.
        delay: f.delay_left.div_ceil(SECOND),
        ttr: whole_secs(f.ttr.unwrap_or(0)),
        time_left: whole_secs(time_left),
        file: 0,
        reserves: f.deliveries as u32,
        timeouts: u32::from(f.counts.timeouts),
        releases: u32::from(f.counts.releases),
        buries: u32::from(f.counts.buries),
        kicks: u32::from(f.counts.kicks),
    };
    ok_yaml(out, |o| stats.write_yaml(o));
}

/// The beanstalkd version tarq's `stats` reports: the protocol it speaks. Clients parse it.
pub const PROTOCOL_VERSION: &str = "1.12";

fn whole_secs(us: Micros) -> u64 {
    us / SECOND
}

/// A `pri` as beanstalk's unsigned 32 bits (tasks put through IPROTO may hold any i64).
fn beanstalk_pri(pri: i64) -> u32 {
    pri.clamp(0, u32::MAX as i64) as u32
}

impl<L: Loop> Beanstalk<'_, L> {
    /// `stats-tube`: the tube's task counts come from the core (summed over its partitions on
    /// a sharded cluster); its connections, waiting reserves, commands and pause are this
    /// node's, kept with the request until the counts come ([`tube_answer`]).
    pub(super) fn bs_stats_tube(&mut self, idx: usize, name: &str) -> Then<'static> {
        let Some(t) = self.l.queue().tube_ix(name) else {
            Out::NotFound.encode(self.l.reply_buf(idx));
            return Then::Done;
        };
        let now = self.l.mono();
        let bs = self.state().tube(t);
        let (pause, pause_left) = match self.l.pauses().of(t) {
            Some(p) if p.until > now => (u64::from(p.seconds), p.until - now),
            _ => (0, 0),
        };
        let asked = TubeAsk {
            name: name.to_owned(),
            using: bs.using,
            watching: bs.watching,
            waiting: self.l.parked_count(t),
            cmd_delete: bs.cmd_delete,
            cmd_pause_tube: bs.cmd_pause_tube,
            pause,
            pause_left,
        };
        self.bs(idx).asked = Some(Box::new(asked));
        self.bs_dispatch(idx, Reply::StatsTube, Command::TubeFigures { tube: t })
    }

    pub(super) fn bs_stats(&mut self, idx: usize) {
        let snapshot = self.l.snapshot();
        let (producers, workers, waiting) = self.l.beanstalk_roles();
        let max_job_size = self.l.config().beanstalk_max_job_size as u64;
        let (utime, stime) = cpu_times();
        let host = read_proc("/proc/sys/kernel/hostname");
        let os = read_proc("/proc/sys/kernel/version");
        let id = format!("{:016x}", self.l.server_id());
        let mut urgent = 0;
        for t in self.l.queue().named_tubes() {
            urgent += self.l.queue().ready_urgent(t.ix).unwrap_or(0);
        }
        let b = &*self.state();
        let sum = |f: fn(&tarq_engine::Stats) -> u64| -> u64 {
            snapshot.tubes.iter().map(|t| f(&t.stats)).sum()
        };
        let wal = snapshot.wal.unwrap_or_default();
        let extra = [
            ("tarq-version", env!("CARGO_PKG_VERSION").to_string()),
            ("tarq-wal-records", wal.records.to_string()),
            ("tarq-wal-bytes", wal.bytes.to_string()),
            ("tarq-beanstalk-errors", b.errors.to_string()),
            ("tarq-connections", snapshot.server.connections.to_string()),
        ];
        let stats = Stats {
            current_jobs_urgent: urgent,
            current_jobs_ready: sum(|s| s.ready),
            current_jobs_reserved: sum(|s| s.taken),
            current_jobs_delayed: sum(|s| s.waiting),
            current_jobs_buried: sum(|s| s.buried),
            cmd_put: b.cmds(CommandKind::Put),
            cmd_peek: b.cmds(CommandKind::Peek),
            cmd_peek_ready: b.cmds(CommandKind::PeekReady),
            cmd_peek_delayed: b.cmds(CommandKind::PeekDelayed),
            cmd_peek_buried: b.cmds(CommandKind::PeekBuried),
            // reserve-job and kick-job are in no `cmd-` figure of beanstalkd 1.12's stats.
            cmd_reserve: b.cmds(CommandKind::Reserve),
            cmd_reserve_with_timeout: b.cmds(CommandKind::ReserveWithTimeout),
            cmd_delete: b.cmds(CommandKind::Delete),
            cmd_release: b.cmds(CommandKind::Release),
            cmd_use: b.cmds(CommandKind::Use),
            cmd_watch: b.cmds(CommandKind::Watch),
            cmd_ignore: b.cmds(CommandKind::Ignore),
            cmd_bury: b.cmds(CommandKind::Bury),
            cmd_kick: b.cmds(CommandKind::Kick),
            cmd_touch: b.cmds(CommandKind::Touch),
            cmd_stats: b.cmds(CommandKind::Stats),
            cmd_stats_job: b.cmds(CommandKind::StatsJob),
            cmd_stats_tube: b.cmds(CommandKind::StatsTube),
            cmd_list_tubes: b.cmds(CommandKind::ListTubes),
            cmd_list_tube_used: b.cmds(CommandKind::ListTubeUsed),
            cmd_list_tubes_watched: b.cmds(CommandKind::ListTubesWatched),
            cmd_pause_tube: b.cmds(CommandKind::PauseTube),
            job_timeouts: sum(|s| s.ttr_returned) + b.dropped_timeouts,
            total_jobs: sum(|s| s.puts) + b.dropped_puts,
            max_job_size,
            current_tubes: snapshot.tubes.len() as u64,
            current_connections: b.connections,
            current_producers: producers,
            current_workers: workers,
            current_waiting: waiting,
            total_connections: b.connections_accepted,
            pid: std::process::id(),
            version: PROTOCOL_VERSION,
            rusage_utime: utime,
            rusage_stime: stime,
            uptime: whole_secs(snapshot.uptime),
            binlog_oldest_index: 0,
            binlog_current_index: 0,
            binlog_records_migrated: 0,
            binlog_records_written: wal.records,
            binlog_max_size: 0,
            draining: false,
            id: &id,
            hostname: host.trim(),
            os: os.trim(),
            platform: std::env::consts::ARCH,
            extra: &extra,
        };
        ok_yaml(self.l.reply_buf(idx), |o| stats.write_yaml(o));
    }
}

/// The process's user and system CPU time (`getrusage`).
fn cpu_times() -> (CpuTime, CpuTime) {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Default::default();
    };
    let t = |tv: nix::sys::time::TimeVal| CpuTime {
        secs: tv.tv_sec().max(0) as u64,
        micros: tv.tv_usec().clamp(0, 999_999) as u32,
    };
    (t(ru.user_time()), t(ru.system_time()))
}

/// A one-line file of /proc (hostname, kernel version), or "" where there is none.
fn read_proc(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
