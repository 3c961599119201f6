//! What a node needs to take part in an election, the limits on each setting and why, and the
//! checks that refuse a bad value by name before any thread starts. The timing rules of the
//! election (when to refresh, when to give up a claim) derive from these values here, so
//! `node` reads them and never recomputes them.

use std::time::Duration;

/// Shortest lease TTL. etcd grants at least 1.5 s with its default election settings (it
/// raises a smaller request silently), and TTLs are whole seconds.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// Longest lease TTL: a primary that may be gone this long before a replica takes over is no
/// longer a failover.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60);
/// Default lease TTL: failover within a few seconds, yet three refresh attempts fit in it.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);
/// Shortest safety margin: scheduling delays of the loop between checking the fence and
/// answering a client are in this range on a loaded machine.
pub const MIN_SAFETY_MARGIN: Duration = Duration::from_millis(100);
/// Shortest polling interval: below this the follower's reads are load on etcd for no gain,
/// since etcd itself expires leases on a 500 ms sweep.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Default polling interval: adds at most this much to a failover.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Shortest budget for one etcd call: a local etcd answers in about a millisecond, a busy one
/// syncing its disk in tens.
pub const MIN_REQUEST_TIMEOUT: Duration = Duration::from_millis(50);
/// Default budget for one etcd call.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest node or cluster name: it is part of etcd keys and of every status line.
pub const MAX_NAME_LEN: usize = 64;
/// The replica set a node is in when it names none, whose keys stay where an unsharded
/// cluster keeps them (`/tarq/<cluster>/leader`, `/tarq/<cluster>/members/`).
pub const DEFAULT_SET: &str = "default";
/// Longest advertised address: a host name (253) plus a port.
pub const MAX_ADDR_LEN: usize = 260;

/// A node's election settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// etcd client URLs (`http://host:port` or `host:port`); calls move to the next one when
    /// one is unreachable.
    pub endpoints: Vec<String>,
    /// The cluster's name: its keys live under `/tarq/<cluster>/`.
    pub cluster: String,
    /// This node's name, unique in the cluster.
    pub name: String,
    /// The address clients and replicas reach this node at, published to the others.
    pub addr: String,
    /// The lifetime of this node's lease, hence of its leadership without etcd's word.
    pub lease_ttl: Duration,
    /// How long before its lease can expire on etcd a leader stops claiming to lead.
    pub safety_margin: Duration,
    /// How often a node reads the leader and member keys and publishes its position.
    pub poll_interval: Duration,
    /// How long the cluster is leaderless before a node campaigns, so that every member has
    /// published its final position first.
    pub settle: Duration,
    /// The budget of one etcd call.
    pub request_timeout: Duration,
    /// Whether this node campaigns at all.
    pub eligible: bool,
    /// The replica set this node belongs to. `None` and `Some("default")` are the default set,
    /// whose keys are the unsharded layout's; a named set `S` elects under
    /// `/tarq/<cluster>/sets/S/`. `Some(_)` also makes the node *sharded*: it reads the cluster
    /// map (every set and the placement) on each poll.
    pub replica_set: Option<String>,
    /// TLS to etcd, for `https://` endpoints.
    pub tls: Option<EtcdTls>,
}

/// How this node speaks TLS to etcd (`https://` endpoints): the CA that signed etcd's
/// certificate, and the client certificate and key etcd asks for with `--client-cert-auth`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca: std::path::PathBuf,
    /// (certificate chain, key), PEM.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A setting refused, naming the value and the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("no etcd endpoint given")]
    NoEndpoint,
    #[error("etcd endpoint {0:?} is not http://host:port or https://host:port")]
    BadEndpoint(String),
    #[error("etcd endpoint {0:?} needs etcd-ca, the CA that signed etcd's certificate")]
    NeedsCa(String),
    #[error("TLS to etcd: {0}")]
    Tls(String),
    #[error("{what} {value:?} must be 1 to {MAX_NAME_LEN} bytes of A-Z a-z 0-9 . _ -")]
    BadName { what: &'static str, value: String },
    #[error("address {0:?} must be 1 to {MAX_ADDR_LEN} bytes")]
    BadAddr(String),
    #[error("lease TTL {} must be whole seconds from {} to {}", human(.0), human(&MIN_LEASE_TTL), human(&MAX_LEASE_TTL))]
    LeaseTtl(Duration),
    #[error("safety margin {} must be from {} to a third of the lease TTL ({}), so that a leader survives one lost refresh", human(.margin), human(&MIN_SAFETY_MARGIN), human(.limit))]
    SafetyMargin { margin: Duration, limit: Duration },
    #[error("poll interval {} must be from {} to a third of the lease TTL ({})", human(.interval), human(&MIN_POLL_INTERVAL), human(.limit))]
    PollInterval { interval: Duration, limit: Duration },
    #[error("settle time {} must be at least the poll interval ({}) and at most the lease TTL ({})", human(.settle), human(.poll), human(.ttl))]
    Settle {
        settle: Duration,
        poll: Duration,
        ttl: Duration,
    },
    #[error("request timeout {} must be from {} to the lease TTL ({})", human(.timeout), human(&MIN_REQUEST_TIMEOUT), human(.ttl))]
    RequestTimeout { timeout: Duration, ttl: Duration },
}

/// A duration as a person writes it: `0 s`, `2 s`, `1.5 s`, `750 ms`, `20 µs` (`Debug`'s
/// `0ns` reads as a unit nobody set).
pub fn human(d: &Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        format!("{secs} s")
    } else if secs > 0 {
        format!("{} s", d.as_secs_f64())
    } else if nanos % 1_000_000 == 0 {
        format!("{} ms", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{} µs", nanos / 1_000)
    } else {
        format!("{nanos} ns")
    }
}

impl Config {
    /// Settings with the defaults for every timing: TTL 3 s, margin TTL/4, poll 250 ms,
    /// settle two polls, request budget 1 s.
    pub fn new(endpoints: Vec<String>, cluster: &str, name: &str, addr: &str) -> Config {
        Config {
            endpoints,
            cluster: cluster.into(),
            name: name.into(),
            addr: addr.into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            safety_margin: DEFAULT_LEASE_TTL / 4,
            poll_interval: DEFAULT_POLL_INTERVAL,
            settle: DEFAULT_POLL_INTERVAL * 2,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            eligible: true,
            replica_set: None,
            tls: None,
        }
    }

    /// Puts this node in replica set `set`, which makes it sharded.
    pub fn with_replica_set(mut self, set: &str) -> Config {
        self.replica_set = Some(set.into());
        self
    }

    /// This node's replica set, `"default"` when none was named.
    pub fn set_name(&self) -> &str {
        self.replica_set.as_deref().unwrap_or(DEFAULT_SET)
    }

    /// Whether this node reads the cluster map and takes part in placement: a replica set was
    /// named, even the default one.
    pub fn sharded(&self) -> bool {
        self.replica_set.is_some()
    }

    /// Where this node's set keeps its election keys: `/tarq/<cluster>/` for the default set,
    /// `/tarq/<cluster>/sets/<set>/` for a named one.
    pub fn set_prefix(&self) -> String {
        set_prefix(&self.cluster, self.set_name())
    }

    /// Sets the TTL and the margin that goes with it (a quarter of it).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Config {
        self.lease_ttl = ttl;
        self.safety_margin = ttl / 4;
        self
    }

    /// Checks every setting; the endpoints come back as base URLs.
    pub fn validate(&self) -> Result<Vec<String>, ConfigError> {
        let endpoints = self.base_urls()?;
        if let Some(https) = endpoints.iter().find(|e| e.starts_with("https://")) {
            if self.tls.is_none() {
                return Err(ConfigError::NeedsCa(https.clone()));
            }
        }
        check_name("cluster name", &self.cluster)?;
        check_name("node name", &self.name)?;
        if let Some(set) = &self.replica_set {
            // The same rule as node names: a set name is one etcd key segment (no `/`), and it
            // is printed in status lines and metric labels.
            check_name("replica set name", set)?;
        }
        if self.addr.is_empty() || self.addr.len() > MAX_ADDR_LEN {
            return Err(ConfigError::BadAddr(self.addr.clone()));
        }
        let ttl = self.lease_ttl;
        if !(MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) || ttl.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseTtl(ttl));
        }
        if !(MIN_SAFETY_MARGIN..=self.refresh_interval()).contains(&self.safety_margin) {
            return Err(ConfigError::SafetyMargin {
                margin: self.safety_margin,
                limit: self.refresh_interval(),
            });
        }
        if !(MIN_POLL_INTERVAL..=self.refresh_interval()).contains(&self.poll_interval) {
            return Err(ConfigError::PollInterval {
                interval: self.poll_interval,
                limit: self.refresh_interval(),
            });
        }
        if !(self.poll_interval..=ttl).contains(&self.settle) {
            return Err(ConfigError::Settle {
                settle: self.settle,
                poll: self.poll_interval,
                ttl,
            });
        }
        if !(MIN_REQUEST_TIMEOUT..=ttl).contains(&self.request_timeout) {
            return Err(ConfigError::RequestTimeout {
                timeout: self.request_timeout,
                ttl,
            });
        }
        Ok(endpoints)
    }

    /// How long a view of the placement may be acted on after its read was sent: the lease TTL
    /// less the safety margin, as a leader's claim (`PlacementFence`). A new owner holds a moved
    /// partition this long after it first saw it (`Placement::owned_since`).
    pub fn placement_validity(&self) -> Duration {
        self.lease_ttl - self.safety_margin
    }

    /// How often the lease is refreshed: a third of its TTL, so two refreshes can fail before
    /// the claim (TTL minus at most a third) runs out.
    pub fn refresh_interval(&self) -> Duration {
        self.lease_ttl / 3
    }

    fn base_urls(&self) -> Result<Vec<String>, ConfigError> {
        base_urls(&self.endpoints)
    }
}

pub(crate) fn base_urls(endpoints: &[String]) -> Result<Vec<String>, ConfigError> {
    if endpoints.is_empty() {
        return Err(ConfigError::NoEndpoint);
    }
    endpoints.iter().map(|e| base_url(e)).collect()
}

fn base_url(endpoint: &str) -> Result<String, ConfigError> {
    let bad = || ConfigError::BadEndpoint(endpoint.to_owned());
    let (scheme, hostport) = match endpoint.split_once("://") {
        Some((scheme @ ("http" | "https"), rest)) => (scheme, rest.trim_end_matches('/')),
        Some(_) => return Err(bad()),
        None => ("http", endpoint),
    };
    let (host, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || hostport.contains('/') || port.parse::<u16>().is_err() {
        return Err(bad());
    }
    Ok(format!("{scheme}://{hostport}"))
}

/// The election prefix of replica set `set` of `cluster`.
pub fn set_prefix(cluster: &str, set: &str) -> String {
    if set == DEFAULT_SET {
        format!("/tarq/{cluster}/")
    } else {
        format!("/tarq/{cluster}/sets/{set}/")
    }
}

fn check_name(what: &'static str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_NAME_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::BadName {
            what,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::new(
            vec!["127.0.0.1:2379".into()],
            "c1",
            "node-1",
            "127.0.0.1:3301",
        )
    }

    #[test]
    fn defaults_are_valid_and_endpoints_become_base_urls() {
        let mut c = config();
        c.endpoints.push("http://etcd.local:2379/".into());
        assert_eq!(
            c.validate().unwrap(),
            ["http://127.0.0.1:2379", "http://etcd.local:2379"]
        );
    }

    #[test]
    fn bad_values_are_named() {
        let check = |edit: fn(&mut Config), want: &str| {
            let mut c = config();
            edit(&mut c);
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} lacks {want:?}");
        };
        check(|c| c.endpoints.clear(), "no etcd endpoint");
        check(
            |c| c.endpoints = vec!["https://h:1".into()],
            "\"https://h:1\"",
        );
        check(|c| c.endpoints = vec!["h".into()], "\"h\" is not");
        check(|c| c.endpoints = vec!["h:99999".into()], "\"h:99999\"");
        check(|c| c.name = "a/b".into(), "node name \"a/b\"");
        check(|c| c.cluster = String::new(), "cluster name \"\"");
        check(
            |c| c.replica_set = Some("s/1".into()),
            "replica set name \"s/1\"",
        );
        check(|c| c.addr = String::new(), "address \"\"");
        check(
            |c| *c = c.clone().with_lease_ttl(Duration::from_secs(1)),
            "lease TTL 1 s must be whole seconds from 2 s to 60 s",
        );
        check(
            |c| *c = c.clone().with_lease_ttl(Duration::from_millis(2500)),
            "2.5 s must be whole seconds",
        );
        check(
            |c| c.safety_margin = Duration::from_secs(2),
            "safety margin 2 s must be from 100 ms to a third of the lease TTL (1 s)",
        );
        check(
            |c| c.poll_interval = Duration::from_millis(10),
            "poll interval 10 ms",
        );
        check(
            |c| c.settle = Duration::from_millis(100),
            "settle time 100 ms",
        );
        check(
            |c| c.request_timeout = Duration::from_secs(5),
            "request timeout 5 s",
        );
    }

    #[test]
    fn the_default_set_keeps_the_unsharded_keys() {
        let c = config();
        assert!(!c.sharded());
        assert_eq!(c.set_prefix(), "/tarq/c1/");
        let d = config().with_replica_set("default");
        assert!(d.sharded());
        assert_eq!(d.set_prefix(), "/tarq/c1/");
        let s = config().with_replica_set("s1");
        assert_eq!(
            (s.set_name(), s.set_prefix().as_str()),
            ("s1", "/tarq/c1/sets/s1/")
        );
    }

    #[test]
    fn durations_print_in_the_units_a_person_writes() {
        for (d, want) in [
            (Duration::ZERO, "0 s"),
            (Duration::from_secs(3), "3 s"),
            (Duration::from_millis(2500), "2.5 s"),
            (Duration::from_millis(750), "750 ms"),
            (Duration::from_micros(20), "20 µs"),
            (Duration::from_nanos(7), "7 ns"),
        ] {
            assert_eq!(human(&d), want);
        }
    }
}
