//! IPROTO driver (tarq, Tarantool running the reference queue, tarantool/queue 1.5.0, tarq
//! `--null`) over the shared codec `tarq_iproto::client`, in one of two call sets:
//! - the seed API: `CALL queue.put([payload])`, `queue.take([timeout])`, `queue.ack([id])`;
//!   a task is a map `{id, status, data, ...}`;
//! - the tarantool/queue API on one named tube: `queue.tube.<name>:put([payload])` (with
//!   `{utube = key}` for the utube types), `:take([timeout])`, `:ack([id])`, the colon form
//!   that Lua, Python and Go clients send; a task is the array `[id, status, data]`, and a take
//!   that timed out answers `[]`.
//!
//! Replies are matched by sync, since a parked take lets later requests on the same connection
//! overtake it. Task ids are read at any integer width: the reference queue's ids are
//! nanosecond clock values (~1.8e18, sent as uint64).

use super::{excerpt, Driver, Duplex, Frame, Kind, ProtoError, Reply, Request, Role};
use serde::{Deserialize, Serialize};
use std::net::TcpStream;
use std::time::Duration;
use tarq_client::cluster::{Cluster, Effect, Options};
use tarq_iproto::client::{self, GREETING_LEN};
use tarq_iproto::codes::ER_READONLY;
use tarq_iproto::mp::{write, Reader};
use tarq_iproto::{keys, split_frame, DEFAULT_MAX_FRAME_BYTES};

/// Largest reply frame accepted: the server's own default frame cap; replies carry one task.
pub const MAX_FRAME_BYTES: usize = DEFAULT_MAX_FRAME_BYTES;
/// Most utube keys a run spreads its tasks over: each is a string the driver encodes once,
/// and a million already exceeds any backlog the loadgen keeps per key.
pub const MAX_UTUBES: usize = 1 << 20;
/// Tube name used when `--tube` is not given.
pub const DEFAULT_TUBE: &str = "loadgen";

/// Which call set a connection speaks.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// The seed's anonymous queue: `queue.put`, `queue.take`, `queue.ack`.
    #[default]
    Seed,
    /// tarantool/queue's named tubes: `queue.tube.<name>:put`, `:take`, `:ack`.
    Tubes,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Seed => "seed",
            Api::Tubes => "tubes",
        }
    }
}

/// tarantool/queue's tube types (TUBES.md).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum TubeType {
    Fifo,
    #[default]
    Fifottl,
    Limfifottl,
    Utube,
    Utubettl,
}

impl TubeType {
    pub fn name(self) -> &'static str {
        match self {
            TubeType::Fifo => "fifo",
            TubeType::Fifottl => "fifottl",
            TubeType::Limfifottl => "limfifottl",
            TubeType::Utube => "utube",
            TubeType::Utubettl => "utubettl",
        }
    }

    /// True for the types whose tasks carry a utube key.
    pub fn keyed(self) -> bool {
        matches!(self, TubeType::Utube | TubeType::Utubettl)
    }
}

impl std::fmt::Display for TubeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tube a tubes-API run drives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tube {
    pub name: String,
    pub kind: TubeType,
    /// utube keys the puts cycle through (utube types only).
    pub utubes: usize,
}

impl Tube {
    /// The arguments of `queue.create_tube(name, type, {if_not_exists = true})`.
    pub fn create_args(&self) -> Vec<u8> {
        let mut args = Vec::new();
        write::array_len(&mut args, 3);
        write::str(&mut args, &self.name);
        write::str(&mut args, self.kind.name());
        write::map_len(&mut args, 1);
        write::str(&mut args, "if_not_exists");
        write::bool(&mut args, true);
        args
    }
}

pub struct IprotoDriver {
    /// The bodies of put, take and ack calls up to their args (function name and keys),
    /// encoded once: a tube's names are long, and they are the same in every request.
    put_head: Vec<u8>,
    take_head: Vec<u8>,
    ack_head: Vec<u8>,
    /// True for the tubes API: tasks are `[id, status, data]` arrays.
    tubes: bool,
    /// `{utube = key}` option maps, encoded once; empty unless the tube is keyed.
    utube_opts: Vec<Vec<u8>>,
    /// The next utube key to put to.
    next_utube: usize,
    /// `[timeout]`, encoded once.
    take_args: Vec<u8>,
    sync: u64,
}

impl IprotoDriver {
    /// A driver for the seed API.
    pub fn new(take_timeout_s: f64) -> Self {
        Self::with_calls(None, take_timeout_s)
    }

    /// A driver for the tubes API on `tube`, or the seed API with `None`.
    pub fn with_calls(tube: Option<&Tube>, take_timeout_s: f64) -> Self {
        let mut take_args = Vec::new();
        write::array_len(&mut take_args, 1);
        write::f64(&mut take_args, take_timeout_s);
        let (put_fn, take_fn, ack_fn) = match tube {
            None => ("queue.put".into(), "queue.take".into(), "queue.ack".into()),
            Some(t) => (
                format!("queue.tube.{}:put", t.name),
                format!("queue.tube.{}:take", t.name),
                format!("queue.tube.{}:ack", t.name),
            ),
        };
        let utube_opts = match tube {
            Some(t) if t.kind.keyed() => (0..t.utubes.clamp(1, MAX_UTUBES))
                .map(|k| {
                    let mut o = Vec::new();
                    write::map_len(&mut o, 1);
                    write::str(&mut o, "utube");
                    write::str(&mut o, &format!("k{k}"));
                    o
                })
                .collect(),
            _ => Vec::new(),
        };
        IprotoDriver {
            put_head: client::call_head(&put_fn),
            take_head: client::call_head(&take_fn),
            ack_head: client::call_head(&ack_fn),
            tubes: tube.is_some(),
            utube_opts,
            next_utube: 0,
            take_args,
            sync: 0,
        }
    }

    /// Which `{utube = key}` option the next put carries, cycling through the keys; `None`
    /// unless the tube is keyed.
    fn next_utube(&mut self) -> Option<usize> {
        if self.utube_opts.is_empty() {
            return None;
        }
        let k = self.next_utube;
        self.next_utube = (k + 1) % self.utube_opts.len();
        Some(k)
    }
}

/// `[payload]`, or `[payload, {utube = key}]`, written in place.
fn put_args(out: &mut Vec<u8>, data: &[u8], utube: Option<&[u8]>) {
    write::array_len(out, if utube.is_some() { 2 } else { 1 });
    write::bin(out, data);
    out.extend_from_slice(utube.unwrap_or_default());
}

/// Read and check the 128-byte greeting.
fn greet(stream: &mut dyn Duplex) -> Result<(), ProtoError> {
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

/// Readiness check for a fresh server: greeting, then `function()` must answer OK (Tarantool
/// listens before its queue module is loaded). Through the one blocking client.
pub fn probe(stream: TcpStream, timeout: Duration, function: &str) -> anyhow::Result<()> {
    let mut c = connected(stream, timeout)?;
    c.call(function, &[0x90], None)
        .map_err(|e| anyhow::anyhow!("{function} answered: {e}"))?;
    Ok(())
}

/// `queue.create_tube(name, type, {if_not_exists = true})` before a tubes-API run; an error
/// names the server's answer (a server without tubes says the procedure is not defined).
pub fn create_tube(stream: TcpStream, timeout: Duration, tube: &Tube) -> anyhow::Result<()> {
    let mut c = connected(stream, timeout)?;
    c.call("queue.create_tube", &tube.create_args(), None)
        .map_err(|e| {
            anyhow::anyhow!(
                "the server does not serve the tarantool/queue API: queue.create_tube({:?}, {:?}) answered: {e}",
                tube.name,
                tube.kind.name()
            )
        })?;
    Ok(())
}

/// The leader of a running tarq cluster at `addrs` (several addresses, the first that answers
/// is asked): the tube of a tubes-API run is created first through the client's redirects, then
/// `Cluster::find_leader` names the node that takes changes. Returns its address (the node
/// in use when every node that answered is a replica: the runner then follows the refusals)
/// and every address known, given or learned, for reconnecting after a failover.
pub fn leader(
    addrs: Vec<String>,
    timeout: Duration,
    tube: Option<&Tube>,
) -> anyhow::Result<(String, Vec<String>)> {
    let mut c = Cluster::connect(addrs, Options::new(timeout))?;
    if let Some(tube) = tube {
        c.call(
            "queue.create_tube",
            &tube.create_args(),
            None,
            Effect::Changes,
        )
        .map_err(|e| anyhow::anyhow!("queue.create_tube({:?}) answered: {e}", tube.name))?;
    }
    let leader = match c.find_leader()? {
        Some(leader) => leader,
        None => c
            .addr()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no address answered"))?,
    };
    Ok((leader, c.addrs().to_vec()))
}

/// The primary a refusal names, in an error text [`IprotoDriver::decode`] wrote for
/// ER_READONLY (`error 7: read-only replica: the primary is ADDR`).
pub fn primary_in_error(text: &str) -> Option<&str> {
    let (code, message) = text.strip_prefix("error ")?.split_once(": ")?;
    if code.parse::<u32>().ok()? != ER_READONLY {
        return None;
    }
    tarq_client::cluster::primary_in(message)
}

fn connected(stream: TcpStream, timeout: Duration) -> anyhow::Result<tarq_client::Client> {
    let c = tarq_client::Client::over(stream, timeout)?;
    if c.greeting().protocol != "Binary" {
        anyhow::bail!(
            "greeting announces protocol {:?}, not Binary",
            c.greeting().protocol
        );
    }
    Ok(c)
}

impl Driver for IprotoDriver {
    fn handshake(&mut self, stream: &mut dyn Duplex, _role: Role) -> Result<(), ProtoError> {
        greet(stream)
    }

    fn encode(&mut self, out: &mut Vec<u8>, req: Request<'_>) -> u64 {
        self.sync += 1;
        let sync = self.sync;
        match req {
            Request::Put(data) => {
                let utube = self.next_utube().map(|k| &self.utube_opts[k][..]);
                client::call_with_head(out, sync, &self.put_head, |o| put_args(o, data, utube));
            }
            // A parked take does not hold up the connection, so every take may wait.
            Request::Take { .. } => client::call_with_head(out, sync, &self.take_head, |o| {
                o.extend_from_slice(&self.take_args)
            }),
            Request::Ack { id, .. } => client::call_with_head(out, sync, &self.ack_head, |o| {
                write::array_len(o, 1);
                write::uint(o, id);
            }),
        }
        sync
    }

    fn split<'a>(&self, buf: &'a [u8]) -> Result<Option<Frame<'a>>, ProtoError> {
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
            reply: None,
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
        let data = resp.data.unwrap_or(&[0x90]);
        match kind {
            // A full limfifottl answers a put with `[nil]`: nothing was stored.
            Kind::Put if self.tubes && data == [0x91, 0xc0] => {
                Ok(Reply::Error("put answered [nil]: the tube is full".into()))
            }
            Kind::Put => Ok(Reply::Put),
            Kind::Ack => Ok(Reply::Acked),
            Kind::Take if self.tubes => tube_task(data),
            Kind::Take => {
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

    fn primary_in<'a>(&self, error: &'a str) -> Option<&'a str> {
        primary_in_error(error)
    }

    fn ordered(&self) -> bool {
        false
    }

    fn blocking_takes(&self) -> bool {
        false
    }
}

/// A tubes-API take's DATA: `[[id, status, data]]`, or `[]` (or `[nil]`) when it timed out.
fn tube_task(data: &[u8]) -> Result<Reply<'_>, ProtoError> {
    let bad = |e: tarq_iproto::mp::MpError| {
        ProtoError::Malformed(format!("take result {}: {e}", excerpt(data)))
    };
    let mut r = Reader::new(data);
    if r.read_array_len().map_err(bad)? == 0 || r.eat_nil() {
        return Ok(Reply::NoTask);
    }
    let fields = r.read_array_len().map_err(bad)?;
    if fields < 3 {
        return Err(ProtoError::Unexpected {
            kind: Kind::Take,
            reply: format!(
                "a task of {fields} fields, not [id, status, data]: {}",
                excerpt(data)
            ),
        });
    }
    let id = r.read_uint().map_err(bad)?;
    r.skip_value().map_err(bad)?;
    // The payload went out as a bin; Tarantool may hand it back as a string.
    let payload = r.read_str_or_bin().unwrap_or(&[]);
    Ok(Reply::Task { id, data: payload })
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
    fn a_read_only_refusal_names_the_primary() {
        let d = IprotoDriver::new(0.1);
        let mut frame = Vec::new();
        response::error(
            &mut frame,
            5,
            ER_READONLY,
            "read-only replica: the primary is 127.0.0.1:3301",
        );
        let Reply::Error(text) = d.decode(&frame, Kind::Put).unwrap() else {
            panic!("not an error");
        };
        assert_eq!(d.primary_in(&text), Some("127.0.0.1:3301"));
        let other = "error 32: read-only replica: the primary is 127.0.0.1:3301";
        assert_eq!(d.primary_in(other), None, "only ER_READONLY redirects");
        assert_eq!(d.primary_in("put answered [nil]: the tube is full"), None);
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
                sync: Some(77),
                reply: None,
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

    fn tube(kind: TubeType, utubes: usize) -> Tube {
        Tube {
            name: "q".into(),
            kind,
            utubes,
        }
    }

    #[test]
    fn tube_takes_read_id_status_data_arrays_and_empty_results() {
        let d = IprotoDriver::with_calls(Some(&tube(TubeType::Fifottl, 1)), 0.1);
        // `[[7, "t", "abc"]]`: tarantool/queue hands the bin payload back as a string.
        let f = reply(1, b"\x93\x07\xa1t\xa3abc");
        assert_eq!(
            d.decode(&f, Kind::Take).unwrap(),
            Reply::Task {
                id: 7,
                data: b"abc"
            }
        );
        // A take that timed out answers `[]`.
        let mut empty = Vec::new();
        response::empty_data(&mut empty, 2);
        assert_eq!(d.decode(&empty, Kind::Take).unwrap(), Reply::NoTask);
        let short = reply(3, b"\x92\x07\xa1t");
        assert!(matches!(
            d.decode(&short, Kind::Take),
            Err(ProtoError::Unexpected { .. })
        ));
        // A full limfifottl answers a put with `[nil]`: not stored, so not counted.
        let full = reply(4, b"\xc0");
        assert!(matches!(d.decode(&full, Kind::Put), Ok(Reply::Error(_))));
        let put = reply(5, b"\x93\x08\xa1r\xc4\x01x");
        assert_eq!(d.decode(&put, Kind::Put).unwrap(), Reply::Put);
    }

    #[test]
    fn tube_calls_use_the_colon_form_and_cycle_utube_keys() {
        use tarq_iproto::request::{self, RequestKind};
        let mut d = IprotoDriver::with_calls(Some(&tube(TubeType::Utube, 2)), 0.5);
        let mut out = Vec::new();
        for _ in 0..3 {
            d.encode(&mut out, Request::Put(b"p"));
        }
        d.encode(&mut out, Request::Take { wait: true });
        d.encode(&mut out, Request::Ack { id: 9, data: b"" });
        let mut buf = &out[..];
        let mut seen = Vec::new();
        while let Some(f) = split_frame(buf, MAX_FRAME_BYTES).unwrap() {
            let req = request::decode(&buf[f.prefix..f.total()]).unwrap();
            let RequestKind::Call { function, args, .. } = req.kind else {
                panic!("not a call: {:?}", req.kind)
            };
            seen.push((function.to_string(), args.to_vec()));
            buf = &buf[f.total()..];
        }
        let key = |k: &[u8]| [b"\x92\xc4\x01p\x81\xa5utube\xa2".as_slice(), k].concat();
        assert_eq!(seen[0], ("queue.tube.q:put".into(), key(b"k0")));
        assert_eq!(seen[1], ("queue.tube.q:put".into(), key(b"k1")));
        assert_eq!(seen[2], ("queue.tube.q:put".into(), key(b"k0")));
        assert_eq!(seen[3].0, "queue.tube.q:take");
        assert_eq!(seen[4], ("queue.tube.q:ack".into(), b"\x91\x09".to_vec()));
        // Unkeyed types put `[payload]` alone.
        let mut d = IprotoDriver::with_calls(Some(&tube(TubeType::Fifo, 5)), 0.5);
        let mut out = Vec::new();
        d.encode(&mut out, Request::Put(b"p"));
        assert!(out.ends_with(b"\xb0queue.tube.q:put\x21\x91\xc4\x01p"));
    }

    #[test]
    fn create_tube_asks_for_if_not_exists() {
        assert_eq!(
            tube(TubeType::Utubettl, 1).create_args(),
            b"\x93\xa1q\xa8utubettl\x81\xadif_not_exists\xc3"
        );
    }
}
