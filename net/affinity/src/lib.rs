//! Pinning to CPU cores, the one way tarq does it. With `--cpu N` the server's event loop pins
//! itself to N ([`pin`]) and keeps that core to itself, as Tarantool's TX thread has its WAL
//! thread beside it, not on it: the WAL's sync and snapshot-writer threads each move themselves
//! to the process's other cores as they start, and [`spawn_off_core`] returns only once they
//! have, so that a server that says it serves has its threads where they belong. Recovery's
//! threads (the snapshot loader, the WAL reader) do not move: the loop does not run yet, and
//! one core would slow the load. The load generator pins itself with [`pin`] and the targets it
//! starts with [`pin_child`].
//!
//! Every call goes through rustix's `sched_getaffinity` and `sched_setaffinity`; the one
//! `unsafe` is the `pre_exec` that pins a child between fork and exec. Which core to use is
//! the caller's to choose; the kernel refuses one that is offline or outside the cgroup's.

use std::io;
use std::process::Command;

use rustix::io::Errno;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

/// The cores the calling thread may run on now, in ascending order.
pub fn allowed() -> io::Result<Vec<usize>> {
    let set = sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Pins the calling thread to core `cpu`, and with it the threads and processes it starts from
/// now on. The error names the core and the cores the thread could run on.
pub fn pin(cpu: usize) -> io::Result<()> {
    only(cpu).map_err(|e| {
        let cores = allowed()
            .map(|cs| {
                cs.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|e| format!("unknown: {e}"));
        io::Error::new(
            e.kind(),
            format!("cannot pin to core {cpu} ({e}; this thread runs on {cores})"),
        )
    })
}

/// Pins the process `cmd` starts (and every thread it starts) to core `cpu` before it runs its
/// program; spawning fails with the kernel's error when it cannot be pinned.
pub fn pin_child(cmd: &mut Command, cpu: usize) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe
    // work is allowed: `only` builds a CpuSet on the stack and makes one system call, and its
    // error is a raw OS error, with no allocation and no lock taken.
    unsafe {
        cmd.pre_exec(move || only(cpu));
    }
}

/// Sets the calling thread's affinity to core `cpu` alone. Allocates nothing: it runs in a
/// forked child (see [`pin_child`]).
fn only(cpu: usize) -> io::Result<()> {
    if cpu >= CpuSet::MAX_CPU {
        return Err(Errno::INVAL.into());
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    Ok(sched_setaffinity(None, &set)?)
}

/// Spawns a named thread that first moves itself off core `loop_cpu` (see [`leave_core`]),
/// and waits until it has before returning.
pub fn spawn_off_core<T: Send + 'static>(
    name: &str,
    loop_cpu: Option<usize>,
    body: impl FnOnce() -> T + Send + 'static,
) -> io::Result<std::thread::JoinHandle<T>> {
    let (moved, wait) = std::sync::mpsc::sync_channel(1);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            leave_core(loop_cpu);
            let _ = moved.send(());
            body()
        })?;
    // An Err here means the thread ended before it signalled (it panicked): the join reports it.
    let _ = wait.recv();
    Ok(handle)
}

/// Moves the calling thread off core `cpu`, when it may run on another; otherwise (no `cpu`,
/// `cpu` not among its cores, or its only core) leaves it where it is. A failure is logged:
/// the thread runs either way.
pub fn leave_core(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    let moved = sched_getaffinity(None).and_then(|mut set| {
        if cpu >= CpuSet::MAX_CPU || !set.is_set(cpu) {
            return Ok(());
        }
        set.unset(cpu);
        if set.count() == 0 {
            return Ok(());
        }
        sched_setaffinity(None, &set)
    });
    if let Err(e) = moved {
        tracing::warn!(cpu, error = %e, "could not keep a thread off the loop's core");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f`'s result on a fresh thread, so that pinning it leaves the test's thread alone.
    fn on_a_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(f).join().expect("ran")
    }

    #[test]
    fn a_thread_leaves_the_loops_core_when_it_has_another_and_stays_otherwise() {
        let allowed = on_a_thread(|| allowed().expect("affinity"));
        let first = allowed[0];
        let after = on_a_thread(move || {
            leave_core(Some(first));
            super::allowed().expect("affinity")
        });
        if allowed.len() > 1 {
            assert_eq!(after, allowed[1..], "every core but the loop's");
        } else {
            assert_eq!(after, allowed, "the only core stays");
        }
        // A core the process may not use, and none: nothing changes.
        let unchanged = on_a_thread(|| {
            leave_core(Some(CpuSet::MAX_CPU + 1));
            leave_core(None);
            super::allowed().expect("affinity")
        });
        assert_eq!(unchanged, allowed);
    }

    #[test]
    fn pin_keeps_a_thread_on_one_core_and_names_a_core_it_refuses() {
        let allowed = on_a_thread(|| allowed().expect("affinity"));
        let last = *allowed.last().expect("a core");
        let pinned = on_a_thread(move || {
            pin(last).expect("pins");
            super::allowed().expect("affinity")
        });
        assert_eq!(pinned, [last]);
        let past = CpuSet::MAX_CPU;
        let refused = on_a_thread(move || pin(past).expect_err("no such core").to_string());
        assert!(
            refused.contains(&format!("core {past}")),
            "the error names the core: {refused}"
        );
    }

    #[test]
    fn a_child_runs_on_the_core_it_was_pinned_to() {
        let allowed = allowed().expect("affinity");
        let last = *allowed.last().expect("a core");
        let mut cmd = Command::new("cat");
        cmd.arg("/proc/self/status");
        pin_child(&mut cmd, last);
        let out = cmd.output().expect("cat runs");
        let status = String::from_utf8(out.stdout).expect("UTF-8");
        let cores = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list")
            .trim();
        assert_eq!(cores, last.to_string());
        // A core that cannot exist: the spawn fails instead of running unpinned.
        let mut cmd = Command::new("true");
        pin_child(&mut cmd, CpuSet::MAX_CPU);
        assert!(cmd.status().is_err(), "spawn refused");
    }
}
