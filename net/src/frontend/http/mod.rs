//! The HTTP front-end: the web console's JSON API under `/api/`, the dashboard at `/`, the
//! live event stream and Prometheus' `/metrics`, on the `--http-listen` port. Like the other
//! two front-ends it only translates: a request head (parsed by `httparse`, in the loop, from
//! the connection's read buffer) becomes the core's [`Command`] — a put, a bury, a kick, a
//! pause — dispatched through [`Loop`], and the [`Outcome`] comes back through [`encode`] as a
//! JSON response; a read (a listing, a tube's figures) reads the queue through
//! [`Loop::reply_with_queue`]. It knows nothing else of the server.
//!
//! Safe by default: with `--user`/`--password` every route but `/metrics` asks for them
//! (HTTP Basic), and actions must come from the console's own origin; without them the API is
//! read-only and an action is refused with 403 and the reason. A request head is at most
//! [`MAX_HEAD_BYTES`] and a body at most [`MAX_BODY_BYTES`]; listings are paged, at most
//! [`MAX_PAGE`] items an answer, so no request makes the loop build a huge answer.

mod assets;
mod host;
pub use host::Hosts;
mod json;
mod response;
mod routes;

use httparse::Status;

use super::{Loop, Then};
use crate::core::Outcome;
pub use json::Answer;

/// One partition of a sharded cluster's tube as the console shows it: where it is, and its
/// figures as its owner last gave them (`None`: the owner did not answer).
#[derive(Clone, Debug)]
pub struct PartitionFigures {
    pub partition: u16,
    pub index: tarq_engine::TubeIx,
    pub set: String,
    /// The owning set's primary's address, while it has one.
    pub primary: Option<String>,
    pub stats: Option<tarq_engine::Stats>,
}

/// A sharded cluster's tube as the console shows it: the whole tube, summed over its
/// partitions (with what their moves carried), and each partition.
#[derive(Clone, Debug)]
pub struct TubeTotals {
    pub stats: tarq_engine::Stats,
    pub partitions: Vec<PartitionFigures>,
}
use response::{error_response, Head};

/// Largest request head (request line and headers): the common servers' default, enough for
/// any browser's request with its cookies, and a bound on what a client may make us buffer
/// before we know what it wants.
pub const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Largest request body: a put's payload as JSON (base64 of binary data grows it by a third).
/// The console's actions send a few bytes; a producer speaking HTTP may put tasks of up to
/// this.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The most a connection's read buffer holds: a whole request.
pub const MAX_REQUEST_BYTES: usize = MAX_HEAD_BYTES + MAX_BODY_BYTES;

/// Headers parsed per request; more is refused with 431.
pub const MAX_HEADERS: usize = 48;

/// Most items in one page of a listing (tubes, tasks): a page of 1,000 tasks of 1 KiB is a
/// 1.4 MB answer built in well under a millisecond; more waits for the next page.
pub const MAX_PAGE: usize = 1000;

/// Page size when the request names none.
pub const DEFAULT_PAGE: usize = 100;

/// Event streams (`/api/events`) open at once: a dashboard holds one, ten operators watching
/// is a busy day, and each costs the loop a write a second.
pub const MAX_EVENT_STREAMS: usize = 64;

/// How to answer a command run for an HTTP request: what the answer shows, whether the
/// connection closes after it, and the number the tube's first task got (task ids shown are
/// the tube API's numbers, as `queue.tube.NAME:put` returns them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub answer: Answer,
    pub close: bool,
    /// The tube the request named (errors name its tasks by their number in it).
    pub tube: tarq_engine::TubeIx,
    pub first: u64,
}

/// The HTTP front-end's server-wide counts.
#[derive(Debug, Default)]
pub struct HttpState {
    /// HTTP connections open now.
    pub connections: u64,
    /// Requests answered since start.
    pub requests: u64,
    /// Requests refused (4xx, 5xx) since start.
    pub errors: u64,
    /// The `Host` names served (`--http-host`).
    pub hosts: Hosts,
}

/// One HTTP connection's state.
#[derive(Debug, Default)]
pub struct HttpConn {
    /// It carries the event stream: its input is ignored from now on.
    pub streaming: bool,
    /// Its last request asked to close after its answer, which another node gives (a sharded
    /// cluster's listing, a task of another set's): the loop closes it once that is written.
    pub close_when_answered: bool,
}

/// Encodes `outcome` as the HTTP response `r` asks for.
#[inline(never)]
pub fn encode(out: &mut Vec<u8>, r: Reply, outcome: &Outcome<'_>) {
    json::encode(out, r, outcome);
}

/// A whole error response that closes the connection (a refusal before any request, at
/// `--max-connections`).
pub fn refusal(out: &mut Vec<u8>, status: u16, why: &str) {
    error_response(out, status, why, true, &[]);
}

/// Writes one server-sent event carrying `data` (one line of JSON) to a stream.
pub fn event(out: &mut Vec<u8>, data: &str) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// The HTTP front-end at work for the loop `L`.
pub struct Http<'a, L: Loop> {
    l: &'a mut L,
}

impl<'a, L: Loop> Http<'a, L> {
    pub fn new(l: &'a mut L) -> Self {
        Http { l }
    }

    /// Answers every complete request at the front of `data`; returns the bytes used and what
    /// the loop does then: close the connection once its answers are written (a request asked
    /// to; a head over [`MAX_HEAD_BYTES`], a body over [`MAX_BODY_BYTES`] or bytes that are no
    /// HTTP got their error), or nothing.
    pub fn execute_input(&mut self, idx: usize, data: &[u8]) -> (usize, Then<'static>) {
        let mut used = 0;
        while !self.l.closing(idx) && used < data.len() {
            if self.l.http_conn(idx).is_some_and(|c| c.streaming) {
                // An event stream's client has nothing more to say: what it sends is dropped.
                return (data.len(), Then::Done);
            }
            let rest = &data[used..];
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            let (head_len, head) = match read_head(&mut req, rest) {
                Ok(Some(read)) => read,
                Ok(None) => break,
                Err((status, why)) => return (data.len(), self.refuse(idx, status, &why)),
            };
            let total = head_len + head.content_length;
            if rest.len() < total {
                break;
            }
            self.l.http().requests += 1;
            let before = self.l.reply_buf(idx).len();
            let then = routes::Request::new(self.l, idx, &head, &rest[head_len..total]).serve();
            used += total;
            if let Then::Close(_) = then {
                return (data.len(), then);
            }
            if head.close && !self.l.closing(idx) {
                if self.l.reply_buf(idx).len() == before {
                    // Not answered yet: another node answers it, and the close waits for that.
                    if let Some(c) = self.l.http_conn(idx) {
                        c.close_when_answered = true;
                    }
                    return (data.len(), Then::Done);
                }
                return (used, Then::Close("HTTP request asked to close"));
            }
        }
        (used, Then::Done)
    }

    /// Answers with `status` and the reason; the loop then closes: the stream cannot be read
    /// on.
    fn refuse(&mut self, idx: usize, status: u16, why: &str) -> Then<'static> {
        self.l.http().errors += 1;
        error_response(self.l.reply_buf(idx), status, why, true, &[]);
        Then::Close("bad HTTP request")
    }
}

/// The head at the front of `rest`, parsed into `req`, and its length: `None` while it is not
/// whole, or the status and reason it is refused with (too long, too many headers, a body
/// over the limit, no HTTP).
fn read_head<'h>(
    req: &mut httparse::Request<'_, 'h>,
    rest: &'h [u8],
) -> Result<Option<(usize, Head<'h>)>, (u16, String)> {
    let too_long = || {
        Err((
            431,
            format!("the request head is over {MAX_HEAD_BYTES} bytes"),
        ))
    };
    let head_len = match req.parse(rest) {
        Ok(Status::Complete(n)) if n <= MAX_HEAD_BYTES => n,
        Ok(Status::Complete(_)) => return too_long(),
        Ok(Status::Partial) if rest.len() >= MAX_HEAD_BYTES => return too_long(),
        Ok(Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err((431, format!("more than {MAX_HEADERS} headers")))
        }
        Err(e) => return Err((400, format!("not an HTTP request: {e}"))),
    };
    let head = Head::of(req)?;
    if head.content_length > MAX_BODY_BYTES {
        let why = format!(
            "a body of {} bytes: at most {MAX_BODY_BYTES} are accepted",
            head.content_length
        );
        return Err((413, why));
    }
    Ok(Some((head_len, head)))
}

/// The content type of a reply made by [`Loop`]'s figures (`/metrics`).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
