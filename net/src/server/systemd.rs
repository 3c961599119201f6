//! Telling systemd (a `Type=notify` unit) what the server is doing, through `sd_notify`'s
//! datagram socket: `READY=1` once the listeners are bound and the queue recovered, so that
//! `systemctl start` returns when clients can be served (and units ordered after tarq start
//! then); `RELOADING=1` … `READY=1` around a SIGHUP reload, so `systemctl reload` is reported
//! as done only once the file has been applied; `STOPPING=1` when a stop begins. Without
//! `NOTIFY_SOCKET` in the environment (not started by systemd) every call does nothing. The
//! protocol is the `sd-notify` crate's; which states to send when is the server's.

use sd_notify::NotifyState;
use tracing::debug;

/// Sends `states` to the service manager, if one is listening. A failure is not the server's
/// problem (systemd only learns the state later), so it is logged, not returned.
fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        debug!(error = %e, "could not notify the service manager");
    }
}

/// The server serves: recovery is done and every listener is bound.
pub(super) fn ready() {
    notify(&[NotifyState::Ready]);
}

/// A SIGHUP reload begins. systemd wants the monotonic time beside it (it tells this reload
/// from an earlier one); without a clock reading the bare state is still valid.
pub(super) fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// The stop has begun (replies in flight are still written, the WAL synced).
pub(super) fn stopping() {
    notify(&[NotifyState::Stopping]);
}
