//! The IPROTO loop's side of [`super::limits`]: admitting an address, the frame cap before
//! authentication, closing the connection holding the most input when the budget is spent, and
//! closing connections whose deadline has passed. Each closure tells the client why (an error
//! with sync 0, as for broken framing), is logged with its reason, and is counted for the stats;
//! the decisions and counts themselves are the limits'.

use std::cmp::Reverse;
use std::io::Write;
use std::net::SocketAddr;

use mio::net::TcpStream;
use tracing::{info, warn};

use super::conn::ReadBuf;
use super::limits::{Expiry, MAX_PRE_AUTH_FRAME_BYTES};
use super::Server;
use tarq_iproto::codes::ER_ACCESS_DENIED;
use tarq_iproto::{response, FrameError};
use tarq_ops::stats::LimitFigures;

/// Tarantool's `ER_TIMEOUT` ("Timeout exceeded"): a deadline closed the connection.
const ER_TIMEOUT: u32 = 78;

/// Tarantool's `ER_MEMORY_ISSUE`: the input budget closed the connection.
const ER_MEMORY_ISSUE: u32 = 2;

/// Tarantool's `ER_UNKNOWN`, for a connection refused at the per-address cap (Tarantool has no
/// such limit and no code for it; every client still reports the message).
pub(super) const ER_UNKNOWN: u32 = 0;

/// What a link's frame may carry beyond the client frame limit: a forwarded call's envelope
/// (the session, the origin node's name, the command's fields) or a move page's (one task that
/// fills a client frame, with its fields and the page's).
pub(crate) const LINK_ENVELOPE_BYTES: usize = 64 << 10;

impl Server {
    /// The largest frame connection `c` may send now: the configured cap, or the small
    /// pre-authentication one until it has authenticated; a link's is the cap and its envelope,
    /// so that every call a client may send can be forwarded, and every task a node holds can
    /// move.
    pub(super) fn frame_cap(&self, c: &super::conn::Conn) -> usize {
        if c.is_link() {
            self.cfg.max_frame_bytes.saturating_add(LINK_ENVELOPE_BYTES)
        } else if c.authenticated {
            self.cfg.max_frame_bytes
        } else {
            MAX_PRE_AUTH_FRAME_BYTES.min(self.cfg.max_frame_bytes)
        }
    }

    /// Counts a new connection against its address's cap; refused, the client gets the
    /// greeting and an error, and the socket is closed. True when admitted.
    pub(super) fn admit_peer(
        &mut self,
        stream: &mut TcpStream,
        peer: SocketAddr,
        hello: &[u8],
    ) -> bool {
        match self.limits.admit(peer.ip()) {
            Ok(()) => true,
            Err(e) => {
                let mut msg = hello.to_vec();
                response::error(&mut msg, 0, ER_UNKNOWN, &e.to_string());
                // One best-effort write into a fresh socket buffer; the close follows regardless.
                let _ = stream.write(&msg);
                let _ = stream.shutdown(std::net::Shutdown::Write);
                warn!(%peer, limit = e.limit, "connection refused: per-address limit reached");
                false
            }
        }
    }

    /// [`admit_peer`](Self::admit_peer) for the HTTP port: a refusal is a 503 naming the limit.
    pub(super) fn admit_http_peer(&mut self, stream: &mut TcpStream, peer: SocketAddr) -> bool {
        match self.limits.admit(peer.ip()) {
            Ok(()) => true,
            Err(e) => {
                let mut msg = Vec::new();
                crate::frontend::http::refusal(&mut msg, 503, &e.to_string());
                let _ = stream.write(&msg);
                let _ = stream.shutdown(std::net::Shutdown::Write);
                warn!(%peer, limit = e.limit, "HTTP connection refused: per-address limit reached");
                false
            }
        }
    }

    /// A frame too big for an unauthenticated connection: refused from its size prefix (no
    /// byte of its body beyond the resting buffer is read), with an error naming the size and
    /// the limit, then the connection is closed. False when `e` is not that case.
    pub(super) fn refuse_pre_auth_frame(&mut self, idx: usize, e: &FrameError) -> bool {
        let c = &self.conns[idx];
        let FrameError::TooBig { len, .. } = *e else {
            return false;
        };
        if c.authenticated {
            return false;
        }
        warn!(
            sid = c.sid,
            peer = %c.peer,
            len,
            limit = MAX_PRE_AUTH_FRAME_BYTES,
            "frame too big before authentication: closing"
        );
        self.limits.counts.pre_auth_frames_refused += 1;
        let msg = format!(
            "Frame of {len} bytes refused before authentication: the limit is \
             {MAX_PRE_AUTH_FRAME_BYTES} bytes until AUTH succeeds"
        );
        response::error(self.conns.out(idx), 0, ER_ACCESS_DENIED, &msg);
        self.begin_close(idx, "frame too big before authentication", true);
        true
    }

    /// The budget had no room for `idx`'s frame to grow: the connection holding the most
    /// unfinished input (the one whose frame started first among equals) is closed, which may
    /// be `idx` itself. `idx`, if still open, is read again next turn and grows into the room.
    pub(super) fn input_budget_full(&mut self, idx: usize) {
        let worst = self
            .conns
            .iter()
            .filter(|(_, c)| c.closing.is_none() && c.guard.charged() > 0)
            .max_by_key(|(_, c)| (c.guard.charged(), Reverse(c.guard.frame_started())))
            .map(|(i, _)| i);
        if let Some(w) = worst {
            let c = &self.conns[w];
            let (held, budget) = (c.guard.charged(), self.limits.config().input_budget);
            warn!(
                sid = c.sid,
                peer = %c.peer,
                held,
                budget,
                "input budget full: closing the connection holding the most unfinished input"
            );
            self.limits.counts.budget_evictions += 1;
            let msg = format!(
                "Input memory budget of {budget} bytes is full (--input-budget-bytes): this \
                 connection holds {held} bytes of an unfinished frame, the most of any"
            );
            response::error(self.conns.out(w), 0, ER_MEMORY_ISSUE, &msg);
            self.begin_close(w, "input budget full", true);
        }
        if self.conns[idx].closing.is_none() {
            self.conns.read_again.push(idx);
        }
    }

    /// Frees a closing connection's input at once (its share of the budget with it): nothing
    /// more is read from it, while its slot may linger for replies it is owed.
    pub(super) fn drop_input(&mut self, idx: usize) {
        let c = &mut self.conns[idx];
        c.rbuf = ReadBuf::default();
        self.limits.settle(&mut c.guard, 0);
    }

    /// Closes every connection whose deadline (frame, authentication, idleness) has passed,
    /// telling it which; the others due are re-armed for their next deadline.
    pub(super) fn expire_deadlines(&mut self) {
        let now = self.mono;
        while let Some((slot, gen, at)) = self.limits.pop_due(now) {
            let busy = self.core.parked_of(slot) > 0;
            let Some(c) = self
                .conns
                .get_mut(slot)
                .filter(|c| c.gen == gen && c.closing.is_none())
            else {
                continue;
            };
            // An event stream's client listens and sends nothing: no more idle than a take
            // that waits; nor is a connection muted for its user's put rate.
            let busy = busy || c.http().is_some_and(|h| h.streaming) || c.muted();
            let auth = c.authenticated;
            let Some(why) = self
                .limits
                .check(&mut c.guard, (slot, gen), at, now, auth, busy)
            else {
                continue;
            };
            let (setting, limit) = why.setting(self.limits.config());
            let seconds = limit as f64 / 1e6;
            let (sid, peer) = (c.sid, c.peer);
            if why == Expiry::Idle {
                info!(sid, %peer, setting, seconds, "closing an idle connection");
            } else {
                warn!(sid, %peer, setting, seconds, reason = why.reason(), "closing connection");
            }
            let msg = format!(
                "Connection closed: {} ({setting} {seconds} s)",
                why.reason()
            );
            let web = c.http().is_some();
            let out = self.conns.out(slot);
            if web {
                // An HTTP client is told in HTTP: 408, the reason as the JSON error.
                crate::frontend::http::refusal(out, 408, &msg);
                if why == Expiry::Frame {
                    self.limits.counts.http_timeouts += 1;
                }
            } else {
                response::error(out, 0, ER_TIMEOUT, &msg);
            }
            self.begin_close(slot, why.reason(), true);
        }
    }

    /// The limits' figures for the stats.
    pub(super) fn limit_figures(&self) -> LimitFigures {
        let c = &self.limits.counts;
        LimitFigures {
            input_bytes: self.limits.held() as u64,
            input_budget: self.limits.config().input_budget as u64,
            frame_timeouts: c.frame_timeouts,
            auth_timeouts: c.auth_timeouts,
            idle_timeouts: c.idle_timeouts,
            budget_evictions: c.budget_evictions,
            pre_auth_frames_refused: c.pre_auth_frames_refused,
            peer_refusals: c.peer_refusals,
            http_timeouts: c.http_timeouts,
            user_refusals: self.quotas.refused,
            puts_delayed: self.quotas.puts_delayed,
        }
    }
}
