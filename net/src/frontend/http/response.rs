//! HTTP/1.1 on the wire: what the front-end needs of a parsed request head ([`Head`]), and
//! responses written whole into the connection's reply buffer (status line, headers with a
//! `Content-Length`, body), so a keep-alive client reads them back to back.

use std::fmt::Write as _;

/// What the front-end reads of a request head.
#[derive(Debug)]
pub struct Head<'h> {
    pub method: &'h str,
    /// The path, percent-encoded as sent, without the query.
    pub path: &'h str,
    pub query: &'h str,
    pub content_length: usize,
    /// The connection closes after the answer (HTTP/1.0 without keep-alive, or
    /// `Connection: close`).
    pub close: bool,
    pub authorization: Option<&'h [u8]>,
    pub origin: Option<&'h [u8]>,
    pub host: Option<&'h [u8]>,
}

impl<'h> Head<'h> {
    /// The parts of a complete request head, or the status and reason refusing it.
    pub fn of(req: &httparse::Request<'_, 'h>) -> Result<Head<'h>, (u16, String)> {
        let method = req.method.unwrap_or("GET");
        let target = req.path.unwrap_or("/");
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let mut head = Head {
            method,
            path,
            query,
            content_length: 0,
            close: req.version == Some(0),
            authorization: None,
            origin: None,
            host: None,
        };
        for h in req.headers.iter() {
            let name = h.name;
            if name.eq_ignore_ascii_case("content-length") {
                let n = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok());
                head.content_length =
                    n.ok_or((400, "Content-Length is not a number".to_owned()))?;
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err((
                    411,
                    "chunked bodies are not accepted: send a Content-Length".to_owned(),
                ));
            } else if name.eq_ignore_ascii_case("connection") {
                let v = h.value.to_ascii_lowercase();
                if v.windows(5).any(|w| w == b"close") {
                    head.close = true;
                } else if v.windows(10).any(|w| w == b"keep-alive") {
                    head.close = false;
                }
            } else if name.eq_ignore_ascii_case("authorization") {
                head.authorization = Some(h.value);
            } else if name.eq_ignore_ascii_case("origin") {
                head.origin = Some(h.value);
            } else if name.eq_ignore_ascii_case("host") {
                head.host = Some(h.value);
            }
        }
        Ok(head)
    }
}

/// The reason phrase of `status`.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Error",
    }
}

/// What every response says of where it may be used: its scripts, styles and requests come
/// from this port only (the console has no inline script), no page of another site may frame
/// it (clickjacking its buttons), and no link out tells where it came from.
const SECURITY: &str = "Content-Security-Policy: default-src 'self'; img-src 'self' data:; \
     style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; \
     form-action 'self'\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n";

/// Appends a whole response: `headers` are extra `(name, value)` pairs.
pub fn write(
    out: &mut Vec<u8>,
    status: u16,
    content_type: &str,
    body: &[u8],
    close: bool,
    headers: &[(&str, &str)],
) {
    let mut head = String::with_capacity(160);
    let _ = write!(
        head,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n{SECURITY}",
        reason(status),
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    head.push_str("\r\n");
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(body);
}

/// A JSON response.
pub fn json(out: &mut Vec<u8>, status: u16, body: &str, close: bool) {
    write(out, status, "application/json", body.as_bytes(), close, &[]);
}

/// A JSON error `{"error": why, "status": status}`.
pub fn error_response(
    out: &mut Vec<u8>,
    status: u16,
    why: &str,
    close: bool,
    headers: &[(&str, &str)],
) {
    let body = serde_json::json!({ "error": why, "status": status }).to_string();
    write(
        out,
        status,
        "application/json",
        body.as_bytes(),
        close,
        headers,
    );
}

/// The head of an event stream: no length, the connection stays open for the events.
pub fn event_stream_head(out: &mut Vec<u8>) {
    out.extend_from_slice(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n\
          X-Accel-Buffering: no\r\nConnection: keep-alive\r\n\r\n",
    );
}
