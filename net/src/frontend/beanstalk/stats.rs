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
use tarq_engine::{Micros, Status, TaskId};

use super::{Beanstalk, Loop, SECOND};

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
    pub(super) fn bs_stats_job(&mut self, idx: usize, id: TaskId) {
        let now = self.l.now();
        let ttr_deadline = self.l.queue().ttr_deadline(id);
        self.l.reply_with_queue(idx, &mut |out, q| {
            let Some(t) = q.get(id) else {
                return Out::NotFound.encode(out);
            };
            let tube = q.tube_info(t.tube).map_or("", |i| i.name);
            let (state, time_left, delay) = match t.status {
                Status::Waiting => {
                    let left = t.runat.saturating_sub(now);
                    (JobState::Delayed, left, left)
                }
                Status::Taken => (
                    JobState::Reserved,
                    ttr_deadline.map_or(0, |d| d.saturating_sub(now)),
                    0,
                ),
                Status::Buried => (JobState::Buried, 0, 0),
                _ => (JobState::Ready, 0, 0),
            };
            let stats = StatsJob {
                id,
                tube,
                state,
                pri: beanstalk_pri(t.pri),
                age: whole_secs(now.saturating_sub(t.created)),
                // Rounded up: right after `put` with a delay of N it reads N, as beanstalkd's.
                delay: delay.div_ceil(SECOND),
                ttr: whole_secs(t.ttr.unwrap_or(0)),
                time_left: whole_secs(time_left),
                file: 0,
                reserves: t.deliveries as u32,
                timeouts: u32::from(t.counts.timeouts),
                releases: u32::from(t.counts.releases),
                buries: u32::from(t.counts.buries),
                kicks: u32::from(t.counts.kicks),
            };
            ok_yaml(out, |o| stats.write_yaml(o));
        });
    }

    pub(super) fn bs_stats_tube(&mut self, idx: usize, name: &str) {
        let Some(t) = self.l.queue().tube_ix(name) else {
            return Out::NotFound.encode(self.l.reply_buf(idx));
        };
        let now = self.l.mono();
        let bs = self.state().tube(t);
        let waiting = self.l.parked_count(t);
        let pause = self.l.pauses().of(t);
        self.l.reply_with_queue(idx, &mut |out, q| {
            let s = q.tube_stats(t).unwrap_or_default();
            let (pause, left) = match pause {
                Some(p) if p.until > now => (u64::from(p.seconds), p.until - now),
                _ => (0, 0),
            };
            let stats = StatsTube {
                name,
                current_jobs_urgent: q.ready_urgent(t).unwrap_or(0),
                current_jobs_ready: s.ready,
                current_jobs_reserved: s.taken,
                current_jobs_delayed: s.waiting,
                current_jobs_buried: s.buried,
                total_jobs: s.puts,
                current_using: bs.using,
                current_watching: bs.watching,
                current_waiting: waiting,
                cmd_delete: bs.cmd_delete,
                cmd_pause_tube: bs.cmd_pause_tube,
                pause,
                pause_time_left: whole_secs(left),
            };
            ok_yaml(out, |o| stats.write_yaml(o));
        });
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
