//! Nemeses: the faults a run injects, and the schedule that orders them from a seed. A fault is
//! chosen, then aimed at whatever holds the role it needs at that moment (the primary, a
//! replica, an etcd member), applied, held for a while, and healed; the harness records its
//! start (`invoke`) and its healing (`ok`) in the history, so the checker and the timeline
//! know when the world was broken and how. The same seed and the same cluster give the same
//! sequence of faults and durations; what they hit depends on who leads, which the faults
//! themselves change.

use std::time::Duration;

use serde::Serialize;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// kill -9 the primary, restart it when healed.
    KillPrimary,
    /// SIGSTOP the primary past its lease, SIGCONT when healed.
    PausePrimary,
    /// Cut the primary from every other host (nodes, etcd, clients).
    IsolatePrimary,
    /// Cut the primary from etcd only: its replicas and clients still reach it.
    PrimaryFromEtcd,
    /// Cut the primary from its replicas only: etcd and clients still reach it.
    PrimaryFromReplicas,
    /// The primary and one etcd member on one side, everyone else on the other.
    MinorityPrimary,
    /// A non-transitive cut: the primary and one replica cannot talk, both reach the other.
    Bridge,
    /// One replica cut from the primary falls behind while the other acknowledges; then the
    /// primary and the up-to-date replica are killed together and the lagging one is left
    /// alone with etcd (the election's KIP-966 case). Healed by restarting the two.
    LaggingReplica,
    /// 30% of packets lost between the primary and every other host.
    Loss,
    /// kill -9 one etcd member (of three), restart it when healed.
    KillEtcd,
    /// SIGSTOP one etcd member, SIGCONT when healed.
    PauseEtcd,
    /// Cut the clients from the primary (the primary and etcd are unaffected).
    ClientsFromPrimary,
    /// Step the primary's wall clock forward or back by up to two minutes (libfaketime), as
    /// NTP or an operator would; it stays stepped. Leadership and fencing run on the monotonic
    /// clock and must not notice; TTRs follow the wall clock (as tarantool/queue's do), so a
    /// step forward may end holds early.
    ClockJump,
    /// Power loss of a whole replica set: every node of it killed at once, and every write its
    /// data directory (a lazyfs mount) had not fsynced forgotten, then all restarted.
    PowerLoss,
    /// Damage one replica's files while it is down (a minority): a byte flipped in the middle
    /// of its newest WAL segment or snapshot, or the segment cut in half. Restarted, it must
    /// notice (checksums) and copy its primary again, never serve what it read wrong.
    Corrupt,
    /// Cut one replica set's nodes from every other set's (sharded runs; etcd and the clients
    /// still reach them all): links and moves between the sets fail.
    SetsApart,
}

impl Fault {
    /// Every fault, in a fixed order (the seed's draws index into it).
    pub const ALL: [Fault; 16] = [
        Fault::KillPrimary,
        Fault::PausePrimary,
        Fault::IsolatePrimary,
        Fault::PrimaryFromEtcd,
        Fault::PrimaryFromReplicas,
        Fault::MinorityPrimary,
        Fault::Bridge,
        Fault::LaggingReplica,
        Fault::Loss,
        Fault::KillEtcd,
        Fault::PauseEtcd,
        Fault::ClientsFromPrimary,
        Fault::ClockJump,
        Fault::PowerLoss,
        Fault::Corrupt,
        Fault::SetsApart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillPrimary => "kill-primary",
            Fault::PausePrimary => "pause-primary",
            Fault::IsolatePrimary => "isolate-primary",
            Fault::PrimaryFromEtcd => "primary-from-etcd",
            Fault::PrimaryFromReplicas => "primary-from-replicas",
            Fault::MinorityPrimary => "minority-primary",
            Fault::Bridge => "bridge",
            Fault::LaggingReplica => "lagging-replica",
            Fault::Loss => "loss",
            Fault::KillEtcd => "kill-etcd",
            Fault::PauseEtcd => "pause-etcd",
            Fault::ClientsFromPrimary => "clients-from-primary",
            Fault::ClockJump => "clock-jump",
            Fault::PowerLoss => "power-loss",
            Fault::Corrupt => "corrupt",
            Fault::SetsApart => "sets-apart",
        }
    }

    /// Whether the fault means anything with `sets` replica sets.
    pub fn applies_to(self, sets: usize) -> bool {
        self != Fault::SetsApart || sets > 1
    }

    /// Whether the fault ends the sessions of the node it hits (a kill, or a pause long enough
    /// for another node to take over and release what they held).
    pub fn frees_holds(self) -> bool {
        matches!(
            self,
            Fault::KillPrimary | Fault::PausePrimary | Fault::LaggingReplica | Fault::PowerLoss
        )
    }
}

/// One scheduled fault: which, held how long, and the quiet time after its healing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub fault: Fault,
    pub hold: Duration,
    pub quiet: Duration,
}

/// The faults of a run, drawn from `seed` among `enabled`, until `total` is used up.
pub fn schedule(seed: u64, enabled: &[Fault], total: Duration) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut steps = Vec::new();
    let mut used = Duration::ZERO;
    if enabled.is_empty() {
        return steps;
    }
    loop {
        let fault = enabled[rng.usize(0..enabled.len())];
        let hold = Duration::from_millis(rng.u64(3_000..8_000));
        let quiet = Duration::from_millis(rng.u64(2_000..5_000));
        if used + hold + quiet > total {
            return steps;
        }
        used += hold + quiet;
        steps.push(Step { fault, hold, quiet });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_schedule_and_fits_the_time() {
        let total = Duration::from_secs(120);
        let a = schedule(7, &Fault::ALL, total);
        assert_eq!(a, schedule(7, &Fault::ALL, total));
        assert_ne!(a, schedule(8, &Fault::ALL, total));
        let used: Duration = a.iter().map(|s| s.hold + s.quiet).sum();
        assert!(
            used <= total && a.len() >= 10,
            "{} steps, {used:?}",
            a.len()
        );
        let only = schedule(7, &[Fault::Loss], total);
        assert!(only.iter().all(|s| s.fault == Fault::Loss));
        assert!(schedule(7, &[], total).is_empty());
    }
}
