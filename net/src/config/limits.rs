//! The connection limits as the operator set them ([`LimitsConfig`]), and their defaults: the
//! frame and AUTH timeouts, and the input budget made from the memory the process may use.
//! What the limits do with a connection is the server's (`crate::server::limits`).

use tarq_engine::Micros;

/// Default `--frame-timeout`: a frame whose first byte has arrived must be complete within
/// this. A maximal 16 MiB frame needs about 0.6 MB/s to make it, which any client on a working
/// network has; a client that stalls mid-frame cannot pin its buffer for longer.
pub const DEFAULT_FRAME_TIMEOUT: Micros = 30_000_000;

/// Default `--auth-timeout`: with `--user` set, a connection must authenticate within this. A
/// connector authenticates in its first round trip; ten seconds covers a slow handshake over a
/// congested link without letting silent connections sit for ever.
pub const DEFAULT_AUTH_TIMEOUT: Micros = 10_000_000;

/// The default input budget is this fraction of the memory the process may use (the machine's,
/// or its cgroup's limit if lower): the tasks are what the memory is for, and partial input is
/// transient.
pub const INPUT_BUDGET_SHARE: u64 = 16;

/// Ceiling of the default input budget: a thousand clients each mid-way through a 1 MiB frame
/// fit in it, and no realistic load holds more partial input at once.
pub const MAX_DEFAULT_INPUT_BUDGET: usize = 1 << 30;

/// The limits as configured (0 turns a timeout or the per-address cap off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Bytes all connections together may hold in input buffers beyond their resting size.
    pub input_budget: usize,
    pub frame_timeout: Micros,
    pub auth_timeout: Micros,
    /// Closes a connection that has sent nothing (and waits for nothing) this long; off by
    /// default, as in Tarantool.
    pub idle_timeout: Micros,
    /// Connections one client address may hold at once, over every front-end.
    pub max_connections_per_peer: usize,
}

impl LimitsConfig {
    /// The defaults for a server whose largest frame is `max_frame_bytes`.
    pub fn with_frame_cap(max_frame_bytes: usize) -> LimitsConfig {
        LimitsConfig {
            input_budget: default_input_budget(max_frame_bytes),
            frame_timeout: DEFAULT_FRAME_TIMEOUT,
            auth_timeout: DEFAULT_AUTH_TIMEOUT,
            idle_timeout: 0,
            max_connections_per_peer: 0,
        }
    }
}

/// A share of the memory available ([`INPUT_BUDGET_SHARE`]), at most
/// [`MAX_DEFAULT_INPUT_BUDGET`], and never below two maximal frames, so that the largest frame
/// always fits beside another.
pub fn default_input_budget(max_frame_bytes: usize) -> usize {
    let share = usize::try_from(available_memory() / INPUT_BUDGET_SHARE).unwrap_or(usize::MAX);
    share
        .min(MAX_DEFAULT_INPUT_BUDGET)
        .max(2 * max_frame_bytes.saturating_add(16))
}

/// Physical memory, or the cgroup's limit when one is set and lower.
pub fn available_memory() -> u64 {
    use nix::unistd::{sysconf, SysconfVar};
    let known = |var| sysconf(var).ok().flatten().filter(|&n| n > 0);
    let phys = match (known(SysconfVar::_PHYS_PAGES), known(SysconfVar::PAGE_SIZE)) {
        (Some(pages), Some(page)) => pages as u64 * page as u64,
        // Unknown: assume a small machine, so the budget errs on the side of less.
        _ => 4 << 30,
    };
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    cgroup.map_or(phys, |c| c.min(phys))
}
