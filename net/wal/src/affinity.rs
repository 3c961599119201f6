//! Keeping the WAL's long-lived threads off the loop's core. With `--cpu N` the event loop
//! pins itself to N and keeps that core to itself, as Tarantool's TX thread has its WAL thread
//! beside it, not on it: the sync and snapshot-writer threads each move themselves to the
//! process's other cores as they start, and [`spawn_off_core`] returns only once it has, so
//! that a server that says it serves has its threads where they belong. Recovery's threads
//! (the snapshot loader, the WAL reader) do not move: the loop does not run yet, and a load on
//! one core took ~40% longer.

/// Spawns a named thread that first moves itself off core `loop_cpu` (see [`leave_core`]),
/// and waits until it has before returning.
pub(crate) fn spawn_off_core<T: Send + 'static>(
    name: &str,
    loop_cpu: Option<usize>,
    body: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
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

/// Moves the calling thread off core `cpu`, when the process may run on another; otherwise
/// (no `cpu`, `cpu` not allowed, or the only core allowed) leaves it where it is.
pub(crate) fn leave_core(cpu: Option<usize>) {
    let Some(cpu) = cpu else { return };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is plain data (all zero is the empty set); sched_getaffinity and
    // sched_setaffinity read or write exactly `size` bytes of the set given, for the calling
    // thread (pid 0); CPU_ISSET, CPU_CLR and CPU_COUNT only touch the set, `cpu` is checked
    // below CPU_SETSIZE first.
    let moved = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut set) != 0 {
            Err(std::io::Error::last_os_error())
        } else if cpu >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(cpu, &set) {
            Ok(())
        } else {
            libc::CPU_CLR(cpu, &mut set);
            if libc::CPU_COUNT(&set) == 0 || libc::sched_setaffinity(0, size, &set) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        }
    };
    if let Err(e) = moved {
        tracing::warn!(cpu, error = %e, "could not keep a WAL thread off the loop's core");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cores() -> Vec<usize> {
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: as in `leave_core`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    #[test]
    fn a_thread_leaves_the_loops_core_when_it_has_another_and_stays_otherwise() {
        let allowed = std::thread::spawn(cores).join().expect("ran");
        let first = allowed[0];
        let after = std::thread::spawn(move || {
            leave_core(Some(first));
            cores()
        })
        .join()
        .expect("ran");
        if allowed.len() > 1 {
            assert_eq!(after, allowed[1..], "every core but the loop's");
        } else {
            assert_eq!(after, allowed, "the only core stays");
        }
        // A core the process may not use, and none: nothing changes.
        let unchanged = std::thread::spawn(|| {
            leave_core(Some(libc::CPU_SETSIZE as usize + 1));
            leave_core(None);
            cores()
        })
        .join()
        .expect("ran");
        assert_eq!(unchanged, allowed);
    }
}
