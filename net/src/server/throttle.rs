//! The loop's side of [`super::quotas`]: counting a connection against its user when it
//! authenticates (or, on the beanstalk port, when it is accepted) and refusing it at the
//! user's limit; charging each put to its user's rate; muting a connection whose put went over
//! it — its input stops at that put, its replies wait — and waking it when the mute ends. The
//! decisions and counts are the quotas'; which users they apply to is decided here: every
//! connection that acts as a user ([`Who::User`]), never the bootstrap administrator, the
//! cluster's own nodes (they log in as it) or an open server's connections ([`Who::Everyone`]).

use std::io::Write;
use std::net::SocketAddr;

use mio::net::TcpStream;
use tracing::{debug, warn};

use super::{Proto, Server};
use crate::core::access::{UserRefused, Who};
use crate::core::Command;

impl Server {
    /// Connection `idx` acts as `who` from now on (it authenticated): counted against that
    /// user's connections, or refused at its limit (then it stays as it was).
    pub(crate) fn set_who(&mut self, idx: usize, who: Who) -> Result<(), UserRefused> {
        let c = &self.conns[idx];
        if c.who == who && (c.quota.is_some() || who == Who::Everyone) {
            return Ok(());
        }
        let key = match &who {
            Who::User(name) => match self.quotas.admit(name, self.max_connections_of(name)) {
                Ok(key) => Some(key),
                Err(e) => {
                    let (sid, peer) = (c.sid, c.peer);
                    warn!(sid, %peer, user = %e.user, limit = e.limit,
                        "connection refused: user-max-connections reached");
                    return Err(e);
                }
            },
            Who::Everyone => None,
        };
        let c = &mut self.conns[idx];
        if let Some(old) = std::mem::replace(&mut c.quota, key) {
            self.quotas.release(old);
        }
        c.who = who;
        Ok(())
    }

    /// A new connection of the beanstalk port acting as a user: counted against it (`Ok`
    /// with its key), or, at the user's limit, closed (beanstalk has no greeting and no error
    /// a client reads unasked, as at `--max-connections`) and its address let go.
    pub(super) fn admit_beanstalk_user(
        &mut self,
        tcp: &mut TcpStream,
        peer: SocketAddr,
        proto: Proto,
        who: &Who,
    ) -> Result<Option<usize>, ()> {
        let (Proto::Beanstalk, Who::User(name)) = (proto, who) else {
            return Ok(None);
        };
        match self.quotas.admit(name, self.max_connections_of(name)) {
            Ok(key) => Ok(Some(key)),
            Err(e) => {
                let _ = tcp.flush();
                let _ = tcp.shutdown(std::net::Shutdown::Both);
                self.limits.release(peer.ip());
                warn!(%peer, user = %e.user, limit = e.limit,
                    "beanstalk connection refused: user-max-connections reached");
                Err(())
            }
        }
    }

    /// The connections user `name` may hold (0: no limit), and whether that is its own limit
    /// rather than the server's (`--user-max-connections`).
    fn max_connections_of(&self, name: &str) -> (usize, bool) {
        let own = self.core.queue().users().get(name);
        own.and_then(|u| u.limits.max_connections)
            .map_or((self.cfg.user_max_connections, false), |n| {
                (n as usize, true)
            })
    }

    /// Charges a put of connection `idx` to its user's rate (its own, or `--user-put-rate`); one over it
    /// marks the connection for a mute at the end of the turn. Out of line: only a limited
    /// user's puts come here.
    #[inline(never)]
    pub(super) fn charge_put(&mut self, idx: usize, cmd: &Command<'_>) {
        if !matches!(cmd, Command::Put { .. } | Command::PutIn { .. }) {
            return;
        }
        let c = &mut self.conns[idx];
        let (Some(key), Who::User(name)) = (c.quota, &c.who) else {
            return;
        };
        let own = self.core.queue().users().get(name).map(|u| u.limits);
        let rate = own
            .and_then(|l| l.put_rate)
            .map_or(self.cfg.user_put_rate, u64::from);
        let delay = self.quotas.charge(key, 1, rate, self.mono);
        if delay > 0 {
            if c.throttle == 0 {
                self.throttled.push(idx);
            }
            c.throttle = c.throttle.max(delay);
        }
    }

    /// Mutes each connection whose puts this turn went over its user's rate, for as long as
    /// the last of them must wait: nothing of its input runs and none of its replies goes out
    /// until then (Kafka's throttled channel).
    pub(super) fn mute_throttled(&mut self) {
        for idx in std::mem::take(&mut self.throttled) {
            let Some(c) = self.conns.get_mut(idx) else {
                continue;
            };
            let delay = std::mem::take(&mut c.throttle);
            let (Some(key), None, true) = (c.quota, c.closing, delay > 0) else {
                continue;
            };
            let until = self.mono.saturating_add(delay);
            c.muted_until = Some(until);
            self.quotas.mute(key, (idx, c.gen), self.mono, until);
            debug!(
                sid = c.sid,
                delay, "connection muted for its user's put rate"
            );
        }
    }

    /// Ends the mutes that are due: their replies go out and their input runs again this
    /// turn (what arrived meanwhile included: the read was skipped, so no readiness event
    /// will come for it).
    pub(super) fn unmute_due(&mut self) {
        while let Some((idx, gen)) = self.quotas.pop_due(self.mono) {
            let Some(c) = self.conns.get_mut(idx).filter(|c| c.gen == gen) else {
                continue;
            };
            if c.muted_until.is_none_or(|t| t > self.mono) {
                continue;
            }
            c.muted_until = None;
            let closing = c.closing.is_some();
            self.conns.mark_flush(idx);
            if !closing {
                self.conns.read_again.push(idx);
            }
        }
    }

    /// Ends every mute at once (the server stops): the replies they held are owed now.
    pub(super) fn unmute_all(&mut self) {
        for (_, c) in self.conns.iter_mut() {
            c.throttle = 0;
            c.muted_until = None;
        }
        self.throttled.clear();
    }
}
