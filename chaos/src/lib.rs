//! tarq-chaos: the fault harness. It starts etcd members and tarq nodes each in its own
//! network namespace on a bridge it makes (and removes again), runs client threads that record
//! every operation as a history, injects faults (nemeses) on a schedule drawn from a seed, and
//! checks the history afterwards: nothing acknowledged lost, nothing delivered that was refused,
//! no task held by two consumers at once.
//!
//! The parts: `net` (hosts in namespaces, partitions with nftables), `procs` (etcd and tarq in
//! those hosts), `workload` (the client threads), `drops` (tubes made and dropped under racing
//! puts), `nemesis` (the faults and their schedule), `run` (one run, start to verdict),
//! `history` (what was done and what came back, as JSON lines), `checker` (the verdict over a
//! history), `timeline` (the picture of a run).

pub mod beanstalk;
pub mod checker;
pub mod drops;
pub mod history;
pub mod lazyfs;
pub mod nemesis;
pub mod net;
pub mod procs;
pub mod run;
pub mod timeline;
pub mod workload;
