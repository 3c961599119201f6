//! A run's history, as Jepsen records one: every operation a client thread sends is an
//! `invoke` event, followed by exactly one completion from the same process: `ok` (done, with
//! what came back), `fail` (a definite error: nothing was done) or `info` (the outcome is
//! unknown: a lost connection, a timeout, an "outcome unknown" error). The harness adds events
//! of its own (`process` = [`HARNESS`]): faults started and healed, leaders seen, the final
//! statistics of each node. One event per line of JSON, so a run can be read while it goes and
//! checked again later (`tarq-chaos check FILE`).

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};

/// The `process` of the harness's own events (faults, leaders, final figures).
pub const HARNESS: u64 = u64::MAX;

/// Which half of an operation an event is, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Invoke,
    /// Done; the event carries what came back.
    Ok,
    /// A definite error: the operation was not done.
    Fail,
    /// Unknown: it may or may not have been done.
    Info,
}

/// What an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum F {
    /// `tube:put(payload)` (IPROTO) or `put` (beanstalk); ok carries `id`.
    Put,
    /// `tube:take(timeout)` or `reserve-with-timeout`; ok carries `id` and `payload`, or
    /// neither when nothing was ready.
    Take,
    /// `tube:ack(id)` or beanstalk `delete`.
    Ack,
    /// `tube:release(id)` or beanstalk `release`.
    Release,
    /// `tube:bury(id)` or beanstalk `bury`.
    Bury,
    /// `tube:drop()` of a tube the harness made to drop (`drops`): ok, the tube is gone with
    /// what it held.
    Drop,
    /// A client's connection ended (`session` names it): every task it held is free again.
    /// Recorded as `info` by the client when it sees the connection fail or closes it.
    Disconnect,
    /// A fault began (`invoke`) or was healed (`ok`); `value` describes it.
    Nemesis,
    /// The harness saw `node` lead its replica set in term `value.term`: tasks taken under an
    /// earlier primary of that set are free again from this event on.
    Leader,
    /// A node's `queue.statistics()` after the faults healed and the queue was drained
    /// (`value`, per tube).
    Stats,
}

/// Which port a client used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Iproto,
    Beanstalk,
}

/// One line of the history. Fields an operation does not use are left out of the JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Microseconds since the run started, on the harness's monotonic clock.
    pub time_us: u64,
    /// The client thread (or [`HARNESS`]); an invoke and its completion share it, and a
    /// process has at most one operation open at a time.
    pub process: u64,
    pub kind: Kind,
    pub f: F,
    /// The node the operation was sent to (or the fault's or leader's node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// The client's connection: a number unique in the run, ended by a `disconnect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tube: Option<String>,
    /// The task: what a put's ok returned, a take's ok delivered, or what ack/release/bury name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// A put's payload (unique in the run), what a take delivered, or the payload of the task
    /// an ack, release or bury names (the client knows what it holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The utube key of a put, or of the task a take delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The ttr a take's task was put with, in milliseconds: after this long from the take's
    /// invoke the task may be delivered again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttr_ms: Option<u64>,
    /// A fail's or info's error, as the server or the socket said it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Anything else: a fault's description, a leader's term, a node's statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<serde_json::Value>,
}

impl Event {
    /// An event with only the required fields set.
    pub fn new(time_us: u64, process: u64, kind: Kind, f: F) -> Event {
        Event {
            time_us,
            process,
            kind,
            f,
            node: None,
            protocol: None,
            session: None,
            tube: None,
            id: None,
            payload: None,
            key: None,
            ttr_ms: None,
            error: None,
            value: None,
        }
    }
}

/// Writes events as JSON lines.
pub fn write(out: &mut impl Write, event: &Event) -> io::Result<()> {
    serde_json::to_writer(&mut *out, event)?;
    out.write_all(b"\n")
}

/// Reads a history written by [`write`]; a line that is not an event is an error naming it.
pub fn read(input: impl BufRead) -> io::Result<Vec<Event>> {
    let mut events = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("history line {}: {e}", n + 1),
            )
        })?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json_lines_leaving_unused_fields_out() {
        let mut put = Event::new(12, 3, Kind::Ok, F::Put);
        put.id = Some(7);
        put.payload = Some("c3-0".into());
        put.tube = Some("jobs".into());
        let mut buf = Vec::new();
        write(&mut buf, &put).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        assert_eq!(
            text,
            "{\"time_us\":12,\"process\":3,\"kind\":\"ok\",\"f\":\"put\",\"tube\":\"jobs\",\"id\":7,\"payload\":\"c3-0\"}\n"
        );
        assert_eq!(read(&buf[..]).unwrap(), vec![put]);
        let err = read(&b"{\"time_us\":1}\n"[..]).unwrap_err();
        assert!(err.to_string().contains("history line 1"), "{err}");
    }
}
