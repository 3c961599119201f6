//! SIGHUP: the server re-reads its configuration (the `--config` file and the password file, under
//! the same command line and environment) and applies what can change while it runs — the log
//! level, the Graphite target and interval, the connection, frame and input limits and timeouts,
//! the per-user limits,
//! the credentials, the busy poll — and logs each setting that needs a restart instead (the listen
//! address, the data dir, the CPU, the metrics address, the WAL settings, and any setting not
//! listed here as live).
//!
//! Reading the file is the caller's (the loop holds a closure from `main`); this file decides
//! and applies.

use tracing::{info, warn};
use tracing_subscriber::filter::LevelFilter;

use crate::config::Config;
use tarq_engine::Micros;
use tarq_ops::{logging, Ops};

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Settings now in force, as `name: old -> new`.
    pub applied: Vec<String>,
    /// Settings that changed in the file but stay as they are until a restart, with why.
    pub kept: Vec<String>,
}

/// Applies `new` over `current` where it can change live, and names every difference.
/// The log level is only recorded here; [`apply`] sets it.
pub fn merge(current: &mut Config, new: Config) -> Outcome {
    let mut out = Outcome::default();
    macro_rules! live {
        ($($field:ident).+, $name:literal) => {
            if current.$($field).+ != new.$($field).+ {
                out.applied.push(format!(
                    "{}: {:?} -> {:?}",
                    $name, current.$($field).+, new.$($field).+
                ));
                current.$($field).+ = new.$($field).+.clone();
            }
        };
    }
    // A duration in µs as a person reads it (`30 s`, `250 ms`; 0 is off).
    let secs = |us: u64| match us {
        0 => "off".to_string(),
        us => tarq_cluster::human(&std::time::Duration::from_micros(us)),
    };
    macro_rules! live_micros {
        ($($field:ident).+, $name:literal) => {
            if current.$($field).+ != new.$($field).+ {
                out.applied.push(format!(
                    "{}: {} -> {}",
                    $name, secs(current.$($field).+), secs(new.$($field).+)
                ));
                current.$($field).+ = new.$($field).+;
            }
        };
    }
    macro_rules! restart {
        ($($field:ident).+, $name:literal) => {
            if current.$($field).+ != new.$($field).+ {
                out.kept.push(format!(
                    "{} stays {:?} until a restart (the file says {:?})",
                    $name, current.$($field).+, new.$($field).+
                ));
            }
        };
    }
    live!(log_level, "log-level");
    live!(max_connections, "max-connections");
    live!(max_frame_bytes, "max-frame-bytes");
    live!(max_write_backlog, "max-write-backlog");
    live!(limits.input_budget, "input-budget-bytes");
    live_micros!(limits.frame_timeout, "frame-timeout");
    live_micros!(limits.auth_timeout, "auth-timeout");
    live_micros!(limits.idle_timeout, "idle-timeout");
    live!(limits.max_connections_per_peer, "max-connections-per-peer");
    live!(metrics_auth, "metrics-auth");
    live!(user_max_connections, "user-max-connections");
    live!(user_put_rate, "user-put-rate");
    live_micros!(busy_poll, "busy-poll");
    live_micros!(ops.graphite_interval, "graphite-interval");
    if current.ops.graphite != new.ops.graphite {
        let show = |t: Option<tarq_ops::graphite::Target>| {
            t.map_or_else(|| "off".to_string(), |t| t.to_string())
        };
        out.applied.push(format!(
            "graphite: {} -> {}",
            show(current.ops.graphite),
            show(new.ops.graphite)
        ));
        current.ops.graphite = new.ops.graphite;
    }
    if current.auth != new.auth {
        // The password itself never goes to the log.
        out.applied
            .push("user/password: changed (new connections use them)".into());
        current.auth = new.auth.clone();
    }
    restart!(listen, "listen");
    restart!(data_dir, "data-dir");
    restart!(cpu, "cpu");
    restart!(null, "null");
    restart!(http_listen, "http-listen");
    restart!(http_hosts, "http-host");
    restart!(beanstalk_listen, "beanstalk-listen");
    restart!(beanstalk_max_job_size, "beanstalk-max-job-size");
    restart!(wal, "the WAL settings (wal-mode, snapshots)");
    restart!(replica_of, "replica-of");
    // The files' contents are read again on every reload (`Server::reload_certificate`); which
    // files and which ports serve TLS are fixed at start, so a reload never turns a port's TLS
    // off or leaves a `required` port with no certificate.
    restart!(
        tls,
        "the TLS settings (listen-tls, beanstalk-tls, http-tls, tls-cert, tls-key, tls-hello-wait)"
    );
    // Settings added later (and not made live above) are caught here, whatever they are.
    let mut rest = new;
    rest.listen = current.listen;
    rest.data_dir = current.data_dir.clone();
    rest.cpu = current.cpu;
    rest.null = current.null;
    rest.http_listen = current.http_listen;
    rest.http_hosts = current.http_hosts.clone();
    rest.beanstalk_listen = current.beanstalk_listen;
    rest.beanstalk_max_job_size = current.beanstalk_max_job_size;
    rest.wal = current.wal.clone();
    rest.replica_of = current.replica_of;
    rest.tls = current.tls.clone();
    if rest != *current {
        out.kept
            .push("other settings changed and need a restart".into());
    }
    out
}

/// Applies a reloaded configuration: merges it into `current`, retargets Graphite, sets the log
/// level, and logs one line saying what changed and one naming what could not.
pub fn apply(current: &mut Config, new: Config, ops: &mut Ops, now: Micros) -> Outcome {
    let old_level = current.log_level.clone();
    let mut out = merge(current, new);
    out.kept.extend(ops.reconfigure(&current.ops, now));
    let new_level = current.log_level.clone();
    let quieter = logging::parse_level(&new_level)
        .is_ok_and(|l| l < LevelFilter::INFO && old_level != new_level);
    // Logged at the more verbose of the two levels, so the line is seen either way.
    if quieter {
        report(&out);
    }
    if old_level != new_level {
        if let Err(e) = logging::set_level(&new_level) {
            out.applied.retain(|a| !a.starts_with("log-level"));
            out.kept.push(format!("log-level stays {old_level}: {e}"));
            current.log_level = old_level;
        }
    }
    if !quieter {
        report(&out);
    }
    out
}

/// A multi-line error (TOML's point at the offending line with a caret) as one log line.
pub fn one_line(error: &str) -> String {
    error
        .lines()
        .map(|l| l.trim().trim_start_matches('|').trim())
        .filter(|l| !l.is_empty() && l.chars().any(|c| c != '^'))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn report(out: &Outcome) {
    if out.applied.is_empty() {
        info!("configuration reloaded: nothing to change");
    } else {
        info!(changes = %out.applied.join("; "), "configuration reloaded");
    }
    if !out.kept.is_empty() {
        warn!(kept = %out.kept.join("; "), "configuration reloaded in part");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Credentials;
    use tarq_ops::OpsConfig;

    #[test]
    fn live_settings_change_and_the_others_are_named() {
        let mut cur = Config::default();
        let new = Config {
            log_level: "debug".into(),
            max_connections: 7,
            busy_poll: 50,
            user_max_connections: 4,
            user_put_rate: 100,
            limits: crate::config::LimitsConfig {
                frame_timeout: 250_000,
                idle_timeout: 90_000_000,
                ..Config::default().limits
            },
            auth: Some(Credentials {
                user: "u".into(),
                password: "secret".into(),
            }),
            listen: "127.0.0.1:4000".parse().unwrap(),
            http_listen: Some("127.0.0.1:9100".parse().unwrap()),
            ops: OpsConfig {
                graphite: Some("tcp://127.0.0.1:2003".parse().unwrap()),
                ..OpsConfig::default()
            },
            ..Config::default()
        };
        let out = merge(&mut cur, new);
        assert_eq!(cur.log_level, "debug");
        assert_eq!(cur.max_connections, 7);
        assert_eq!(cur.busy_poll, 50, "the loop reads it before each wait");
        assert!(cur.ops.graphite.is_some() && cur.auth.is_some());
        assert_eq!(
            cur.listen,
            Config::default().listen,
            "listen needs a restart"
        );
        assert_eq!(cur.http_listen, None);
        let applied = out.applied.join("\n");
        for want in [
            "log-level: \"info\" -> \"debug\"",
            "max-connections: 1000 -> 7",
            "busy-poll: off -> 50 µs",
            "frame-timeout: 30 s -> 250 ms",
            "idle-timeout: off -> 90 s",
            "user-max-connections: 0 -> 4",
            "user-put-rate: 0 -> 100",
            "graphite: off -> tcp://127.0.0.1:2003",
            "user/password: changed",
        ] {
            assert!(applied.contains(want), "{want} in {applied}");
        }
        assert!(!applied.contains("secret"), "passwords stay out of logs");
        let kept = out.kept.join("\n");
        assert!(kept.contains("listen stays 127.0.0.1:3301"), "{kept}");
        assert!(kept.contains("http-listen stays None"), "{kept}");
        assert!(!kept.contains("other settings"), "{kept}");
    }

    #[test]
    fn an_unchanged_file_changes_nothing() {
        let mut cur = Config::default();
        let out = merge(&mut cur, Config::default());
        assert_eq!(out, Outcome::default());
    }
}
