//! The YAML bodies of `OK` replies, written as beanstalkd 1.12 writes them: a `---\n` header,
//! one `key: value\n` per field in beanstalkd's order, values unquoted except `version`, and
//! lists as `- name\n`. The front-end fills [`Stats`], [`StatsJob`] and [`StatsTube`] from
//! the engine; [`ok_yaml`] frames a body as `OK <bytes>\r\n<body>\r\n`.

use std::io::Write;

/// A job's state as `stats-job` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Ready,
    Delayed,
    Reserved,
    Buried,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Delayed => "delayed",
            JobState::Reserved => "reserved",
            JobState::Buried => "buried",
        }
    }
}

/// `stats-job`: times in whole seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsJob<'a> {
    pub id: u64,
    pub tube: &'a str,
    pub state: JobState,
    pub pri: u32,
    pub age: u64,
    pub delay: u64,
    pub ttr: u64,
    pub time_left: u64,
    /// The earliest binlog file holding the job; 0 without a binlog.
    pub file: u64,
    pub reserves: u32,
    pub timeouts: u32,
    pub releases: u32,
    pub buries: u32,
    pub kicks: u32,
}

/// `stats-tube`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsTube<'a> {
    pub name: &'a str,
    pub current_jobs_urgent: u64,
    pub current_jobs_ready: u64,
    pub current_jobs_reserved: u64,
    pub current_jobs_delayed: u64,
    pub current_jobs_buried: u64,
    pub total_jobs: u64,
    pub current_using: u64,
    pub current_watching: u64,
    pub current_waiting: u64,
    pub cmd_delete: u64,
    pub cmd_pause_tube: u64,
    pub pause: u64,
    pub pause_time_left: u64,
}

/// Process CPU time as `rusage-utime`/`rusage-stime` print it: seconds and microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTime {
    pub secs: u64,
    pub micros: u32,
}

/// `stats`: beanstalkd's keys in its order. `extra` follows them (tarq's own keys): clients
/// read the keys they know and ignore the rest.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats<'a> {
    pub current_jobs_urgent: u64,
    pub current_jobs_ready: u64,
    pub current_jobs_reserved: u64,
    pub current_jobs_delayed: u64,
    pub current_jobs_buried: u64,
    pub cmd_put: u64,
    pub cmd_peek: u64,
    pub cmd_peek_ready: u64,
    pub cmd_peek_delayed: u64,
    pub cmd_peek_buried: u64,
    pub cmd_reserve: u64,
    pub cmd_reserve_with_timeout: u64,
    pub cmd_delete: u64,
    pub cmd_release: u64,
    pub cmd_use: u64,
    pub cmd_watch: u64,
    pub cmd_ignore: u64,
    pub cmd_bury: u64,
    pub cmd_kick: u64,
    pub cmd_touch: u64,
    pub cmd_stats: u64,
    pub cmd_stats_job: u64,
    pub cmd_stats_tube: u64,
    pub cmd_list_tubes: u64,
    pub cmd_list_tube_used: u64,
    pub cmd_list_tubes_watched: u64,
    pub cmd_pause_tube: u64,
    pub job_timeouts: u64,
    pub total_jobs: u64,
    pub max_job_size: u64,
    pub current_tubes: u64,
    pub current_connections: u64,
    pub current_producers: u64,
    pub current_workers: u64,
    pub current_waiting: u64,
    pub total_connections: u64,
    pub pid: u32,
    /// Written in double quotes, as beanstalkd does (`version: "1.12"`).
    pub version: &'a str,
    pub rusage_utime: CpuTime,
    pub rusage_stime: CpuTime,
    pub uptime: u64,
    pub binlog_oldest_index: u64,
    pub binlog_current_index: u64,
    pub binlog_records_migrated: u64,
    pub binlog_records_written: u64,
    pub binlog_max_size: u64,
    pub draining: bool,
    /// A random id for this process, 16 hex digits in beanstalkd.
    pub id: &'a str,
    pub hostname: &'a str,
    pub os: &'a str,
    pub platform: &'a str,
    /// More `key: value` lines after beanstalkd's.
    pub extra: &'a [(&'a str, String)],
}

// Writing into a Vec cannot fail: the `write!` results below are discarded on purpose.

impl StatsJob<'_> {
    pub fn write_yaml(&self, out: &mut Vec<u8>) {
        let s = self;
        let _ = write!(
            out,
            "---\nid: {}\ntube: {}\nstate: {}\npri: {}\nage: {}\ndelay: {}\nttr: {}\n\
             time-left: {}\nfile: {}\nreserves: {}\ntimeouts: {}\nreleases: {}\nburies: {}\n\
             kicks: {}\n",
            s.id,
            s.tube,
            s.state.as_str(),
            s.pri,
            s.age,
            s.delay,
            s.ttr,
            s.time_left,
            s.file,
            s.reserves,
            s.timeouts,
            s.releases,
            s.buries,
            s.kicks
        );
    }
}

impl StatsTube<'_> {
    pub fn write_yaml(&self, out: &mut Vec<u8>) {
        let s = self;
        let _ = write!(
            out,
            "---\nname: {}\ncurrent-jobs-urgent: {}\ncurrent-jobs-ready: {}\n\
             current-jobs-reserved: {}\ncurrent-jobs-delayed: {}\ncurrent-jobs-buried: {}\n\
             total-jobs: {}\ncurrent-using: {}\ncurrent-watching: {}\ncurrent-waiting: {}\n\
             cmd-delete: {}\ncmd-pause-tube: {}\npause: {}\npause-time-left: {}\n",
            s.name,
            s.current_jobs_urgent,
            s.current_jobs_ready,
            s.current_jobs_reserved,
            s.current_jobs_delayed,
            s.current_jobs_buried,
            s.total_jobs,
            s.current_using,
            s.current_watching,
            s.current_waiting,
            s.cmd_delete,
            s.cmd_pause_tube,
            s.pause,
            s.pause_time_left
        );
    }
}

impl Stats<'_> {
    /// The numeric keys up to `total-connections`, in beanstalkd's order.
    fn counters(&self) -> [(&'static str, u64); 36] {
        let s = self;
        [
            ("current-jobs-urgent", s.current_jobs_urgent),
            ("current-jobs-ready", s.current_jobs_ready),
            ("current-jobs-reserved", s.current_jobs_reserved),
            ("current-jobs-delayed", s.current_jobs_delayed),
            ("current-jobs-buried", s.current_jobs_buried),
            ("cmd-put", s.cmd_put),
            ("cmd-peek", s.cmd_peek),
            ("cmd-peek-ready", s.cmd_peek_ready),
            ("cmd-peek-delayed", s.cmd_peek_delayed),
            ("cmd-peek-buried", s.cmd_peek_buried),
            ("cmd-reserve", s.cmd_reserve),
            ("cmd-reserve-with-timeout", s.cmd_reserve_with_timeout),
            ("cmd-delete", s.cmd_delete),
            ("cmd-release", s.cmd_release),
            ("cmd-use", s.cmd_use),
            ("cmd-watch", s.cmd_watch),
            ("cmd-ignore", s.cmd_ignore),
            ("cmd-bury", s.cmd_bury),
            ("cmd-kick", s.cmd_kick),
            ("cmd-touch", s.cmd_touch),
            ("cmd-stats", s.cmd_stats),
            ("cmd-stats-job", s.cmd_stats_job),
            ("cmd-stats-tube", s.cmd_stats_tube),
            ("cmd-list-tubes", s.cmd_list_tubes),
            ("cmd-list-tube-used", s.cmd_list_tube_used),
            ("cmd-list-tubes-watched", s.cmd_list_tubes_watched),
            ("cmd-pause-tube", s.cmd_pause_tube),
            ("job-timeouts", s.job_timeouts),
            ("total-jobs", s.total_jobs),
            ("max-job-size", s.max_job_size),
            ("current-tubes", s.current_tubes),
            ("current-connections", s.current_connections),
            ("current-producers", s.current_producers),
            ("current-workers", s.current_workers),
            ("current-waiting", s.current_waiting),
            ("total-connections", s.total_connections),
        ]
    }

    pub fn write_yaml(&self, out: &mut Vec<u8>) {
        let s = self;
        out.extend_from_slice(b"---\n");
        for (key, value) in self.counters() {
            let _ = writeln!(out, "{key}: {value}");
        }
        let (u, st) = (s.rusage_utime, s.rusage_stime);
        let _ = write!(
            out,
            "pid: {}\nversion: \"{}\"\nrusage-utime: {}.{:06}\nrusage-stime: {}.{:06}\n\
             uptime: {}\nbinlog-oldest-index: {}\nbinlog-current-index: {}\n\
             binlog-records-migrated: {}\nbinlog-records-written: {}\nbinlog-max-size: {}\n\
             draining: {}\nid: {}\nhostname: {}\nos: {}\nplatform: {}\n",
            s.pid,
            s.version,
            u.secs,
            u.micros,
            st.secs,
            st.micros,
            s.uptime,
            s.binlog_oldest_index,
            s.binlog_current_index,
            s.binlog_records_migrated,
            s.binlog_records_written,
            s.binlog_max_size,
            s.draining,
            s.id,
            s.hostname,
            s.os,
            s.platform
        );
        for (key, value) in s.extra {
            let _ = writeln!(out, "{key}: {value}");
        }
    }
}

/// `list-tubes` and `list-tubes-watched`: a YAML list of names.
pub fn write_list<'n>(out: &mut Vec<u8>, names: impl IntoIterator<Item = &'n str>) {
    out.extend_from_slice(b"---\n");
    for name in names {
        out.extend_from_slice(b"- ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
}

/// Appends `OK <bytes>\r\n<body>\r\n` with the body `write` produces, without a second
/// buffer: the body is written in place, then the header is slid in front of it.
pub fn ok_yaml(out: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    write(out);
    let len = out.len() - start;
    let mut header = Vec::with_capacity(24);
    let _ = write!(header, "OK {len}\r\n");
    out.splice(start..start, header);
    out.extend_from_slice(b"\r\n");
}
