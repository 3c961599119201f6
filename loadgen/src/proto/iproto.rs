//! IPROTO driver (tarq, Tarantool running the reference queue, tarq `--null`) over the shared
//! codec `tarq_iproto::client`: `CALL queue.put([payload])`, `CALL queue.take(timeout)`,
//! `CALL queue.ack(id)`. Replies are matched by sync, since a parked take lets later requests on
//! the same connection overtake it. Task ids are read at any integer width: the reference queue's
//! ids are nanosecond clock values (~1.8e18, sent as uint64).

use super::{excerpt, Driver, Frame, Kind, ProtoError, Reply, Request, Role};
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;
use tarq_iproto::client::{self, GREETING_LEN};
use tarq_iproto::mp::{write, Reader};
use tarq_iproto::{keys, split_frame, DEFAULT_MAX_FRAME_BYTES};

/// Largest reply frame accepted: the server's own default frame cap; replies carry one task.
pub const MAX_FRAME_BYTES: usize = DEFAULT_MAX_FRAME_BYTES;

pub struct IprotoDriver {
    /// `[timeout]`, encoded once.
    take_args: Vec<u8>,
    /// Reused to encode put and ack arguments without allocating.
    scratch: Vec<u8>,
    sync: u64,
}

impl IprotoDriver {
    pub fn new(take_timeout_s: f64) -> Self {
        let mut take_args = Vec::new();
        write::array_len(&mut take_args, 1);
        write::f64(&mut take_args, take_timeout_s);
        IprotoDriver {
            take_args,
            scratch: Vec::with_capacity(64),
            sync: 0,
        }
    }
}

/// Read and check the 128-byte greeting.
fn greet(stream: &mut TcpStream) -> Result<(), ProtoError> {
    let mut g = [0u8; GREETING_LEN];
    stream.read_exact(&mut g)?;
    let greeting = client::parse_greeting(&g).map_err(|e| ProtoError::Handshake(e.to_string()))?;
    if greeting.protocol != "Binary" {
        return Err(ProtoError::Handshake(format!(
            "greeting announces protocol {:?}, not Binary",
            greeting.protocol
        )));
    }
    Ok(())
}

/// Readiness check for a fresh server: greeting, then `queue.stats()` must answer OK (the
/// reference listens before its queue module is loaded). Through the one blocking client.
pub fn probe(stream: TcpStream, timeout: Duration) -> anyhow::Result<()> {
    let mut c = tarq_client::Client::over(stream, timeout)?;
    if c.greeting().protocol != "Binary" {
        anyhow::bail!(
            "greeting announces protocol {:?}, not Binary",
            c.greeting().protocol
        );
    }
    c.call("queue.stats", &[0x90], None)
        .map_err(|e| anyhow::anyhow!("queue.stats answered: {e}"))?;
    Ok(())
}

impl Driver for IprotoDriver {
    fn handshake(&mut self, stream: &mut TcpStream, _role: Role) -> Result<(), ProtoError> {
        greet(stream)
    }

    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64 {
        self.sync += 1;
        let sync = self.sync;
        match req {
            Request::Put(data) => {
                self.scratch.clear();
                write::array_len(&mut self.scratch, 1);
                write::bin(&mut self.scratch, data);
                client::call(out, sync, "queue.put", &self.scratch);
            }
            // A parked take does not hold up the connection, so every take may wait.
            Request::Take { .. } => client::call(out, sync, "queue.take", &self.take_args),
            Request::Ack { id, .. } => {
                self.scratch.clear();
                write::array_len(&mut self.scratch, 1);
                write::uint(&mut self.scratch, id);
                client::call(out, sync, "queue.ack", &self.scratch);
            }
        }
        sync
    }

    fn split(&self, buf: &[u8]) -> Result<Option<Frame>, ProtoError> {
        let Some(f) =
            split_frame(buf, MAX_FRAME_BYTES).map_err(|e| ProtoError::Malformed(e.to_string()))?
        else {
            return Ok(None);
        };
        // Only the header is read here, for the sync; `decode` reads the rest.
        let mut r = Reader::new(&buf[f.prefix..f.total()]);
        let bad = |e: tarq_iproto::mp::MpError| ProtoError::Malformed(format!("header: {e}"));
        let mut sync = 0;
        for _ in 0..r.read_map_len().map_err(bad)? {
            if r.read_uint().map_err(bad)? == keys::SYNC {
                sync = r.read_uint().map_err(bad)?;
            } else {
                r.skip_value().map_err(bad)?;
            }
        }
        Ok(Some(Frame {
            len: f.total(),
            sync: Some(sync),
        }))
    }

    fn decode<'a>(&self, frame: &'a [u8], kind: Kind) -> Result<Reply<'a>, ProtoError> {
        let f = split_frame(frame, MAX_FRAME_BYTES)
            .map_err(|e| ProtoError::Malformed(e.to_string()))?
            .ok_or_else(|| ProtoError::Malformed("incomplete IPROTO frame".into()))?;
        let resp = client::decode(&frame[f.prefix..f.total()])
            .map_err(|e| ProtoError::Malformed(e.to_string()))?;
        if !resp.is_ok() {
            return Ok(Reply::Error(format!(
                "error {}: {}",
                resp.code,
                resp.error.unwrap_or("(no message)")
            )));
        }
        match kind {
            Kind::Put => Ok(Reply::Put),
            Kind::Ack => Ok(Reply::Acked),
            Kind::Take => {
                let data = resp.data.unwrap_or(&[0x90]);
                let task =
                    client::task(data).map_err(|e| ProtoError::Malformed(format!("task: {e}")))?;
                let Some(task) = task else {
                    return Ok(Reply::NoTask);
                };
                let id = task.id.ok_or_else(|| ProtoError::Unexpected {
                    kind,
                    reply: format!("a task without an id: {}", excerpt(data)),
                })?;
                // The payload went out as a bin; Tarantool hands it back as a string.
                let payload = task
                    .data
                    .and_then(|raw| Reader::new(raw).read_str_or_bin().ok())
                    .unwrap_or(&[]);
                Ok(Reply::Task { id, data: payload })
            }
        }
    }

    fn ordered(&self) -> bool {
        false
    }

    fn blocking_takes(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_iproto::response;

    fn reply(sync: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let start = response::begin_data(&mut out, sync, 1);
        out.extend_from_slice(body);
        response::finish(&mut out, start);
        out
    }

    #[test]
    fn split_reads_the_sync_and_waits_for_whole_frames() {
        let d = IprotoDriver::new(0.1);
        let frame = reply(77, b"\x81\xa2id\x01");
        for cut in 0..frame.len() {
            assert_eq!(d.split(&frame[..cut]).unwrap(), None, "cut at {cut}");
        }
        let mut two = frame.clone();
        two.extend_from_slice(&reply(78, b"\xc0"));
        assert_eq!(
            d.split(&two).unwrap(),
            Some(Frame {
                len: frame.len(),
                sync: Some(77)
            })
        );
    }

    #[test]
    fn take_replies_give_the_id_at_any_width_and_the_payload() {
        let d = IprotoDriver::new(0.1);
        // Tarantool's ids are ~1.8e18: a uint64; it returns the bin payload as a string.
        let f = reply(
            1,
            b"\x84\xa2id\xcf\x19\x00\x00\x00\x00\x00\x00\x01\xa6status\xa1T\xa5runat\x00\xa4data\xa3abc",
        );
        assert_eq!(
            d.decode(&f, Kind::Take).unwrap(),
            Reply::Task {
                id: 0x1900_0000_0000_0001,
                data: b"abc"
            }
        );
        let f = reply(2, b"\x82\xa2id\x05\xa4data\xc4\x02hi");
        assert_eq!(
            d.decode(&f, Kind::Take).unwrap(),
            Reply::Task { id: 5, data: b"hi" }
        );
        let mut empty = Vec::new();
        response::empty_data(&mut empty, 3);
        assert_eq!(d.decode(&empty, Kind::Take).unwrap(), Reply::NoTask);
        assert_eq!(d.decode(&empty, Kind::Put).unwrap(), Reply::Put);
        assert_eq!(d.decode(&empty, Kind::Ack).unwrap(), Reply::Acked);
    }

    #[test]
    fn errors_carry_the_servers_message() {
        let d = IprotoDriver::new(0.1);
        let mut out = Vec::new();
        response::error(&mut out, 9, 32, "Task 3 not taken by anybody");
        assert_eq!(
            d.decode(&out, Kind::Ack).unwrap(),
            Reply::Error("error 32: Task 3 not taken by anybody".into())
        );
    }

    #[test]
    fn requests_are_calls_the_server_side_decodes() {
        use tarq_iproto::request::{self, RequestKind};
        let mut d = IprotoDriver::new(0.25);
        let mut out = Vec::new();
        let s1 = d.encode(&mut out, Request::Put(b"payload"));
        let s2 = d.encode(&mut out, Request::Take { wait: true });
        let s3 = d.encode(
            &mut out,
            Request::Ack {
                id: u64::MAX,
                data: b"",
            },
        );
        assert_eq!((s1, s2, s3), (1, 2, 3));
        let mut buf = &out[..];
        let mut seen = Vec::new();
        while let Some(f) = split_frame(buf, MAX_FRAME_BYTES).unwrap() {
            let req = request::decode(&buf[f.prefix..f.total()]).unwrap();
            let RequestKind::Call { function, args, .. } = req.kind else {
                panic!("not a call: {:?}", req.kind)
            };
            seen.push((req.sync, function.to_string(), args.to_vec()));
            buf = &buf[f.total()..];
        }
        assert_eq!(seen[0].1, "queue.put");
        assert_eq!(seen[0].2, b"\x91\xc4\x07payload");
        assert_eq!(seen[1].1, "queue.take");
        assert_eq!(seen[1].2, b"\x91\xcb\x3f\xd0\x00\x00\x00\x00\x00\x00");
        assert_eq!(seen[2].1, "queue.ack");
        assert_eq!(seen[2].2, b"\x91\xcf\xff\xff\xff\xff\xff\xff\xff\xff");
    }
}
