//! TLS on the client ports: the per-port mode ([`TlsMode`], set in `crate::config::tls`), the
//! server's certificate and key read from PEM files into a rustls `ServerConfig`
//! ([`TlsFiles::load`], again on every SIGHUP), and [`Stream`], the connection's socket as the
//! loop sees it — plain TCP, or a rustls `ServerConnection` driven over it. rustls is sans-IO:
//! `Stream` moves ciphertext between the socket and rustls and hands the loop plaintext through
//! the same `Read`/`Write` a plain socket has, so the front-ends, the buffers and the loop's
//! read and flush phases stay as they are.
//!
//! The loop keeps two rules for a TLS stream that a plain one does not need: a short read does
//! not mean the socket is drained (rustls may hold more records), so it reads until `WouldBlock`
//! ([`Stream::reads_to_block`]); and bytes it accepted may still sit in rustls as records the
//! socket had no room for, so it keeps asking for writability while [`Stream::wants_write`].
//!
//! An `optional` port tells TLS from plain by the first byte a client sends: a TLS ClientHello
//! is a handshake record, 0x16, which opens no beanstalk command, HTTP request or IPROTO frame.
//! IPROTO's server speaks first, so there the greeting waits: a client that sends nothing within
//! `--tls-hello-wait` is plain. Deciding the mode, the waits and the refusals is the loop's.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection,
};

use crate::config::{TlsFiles, TlsMode};

/// The first byte of a TLS record carrying a handshake message (RFC 8446 §5.1): every
/// ClientHello starts with it.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Plaintext handed to rustls in one write: a few full records (16 KiB each). More would only
/// move unsent bytes from the connection's reply buffer, which the write backlog limit counts,
/// into rustls, which it does not.
const WRITE_CHUNK_BYTES: usize = 64 * 1024;

/// What the files make: the configuration every new TLS connection on a port starts from, and,
/// with a cluster CA, the one this node's own connections to other nodes start from.
pub struct Loaded {
    pub server: Arc<ServerConfig>,
    pub nodes: Option<Arc<ClientConfig>>,
}

impl TlsFiles {
    /// Reads the chain, the key and the CA. The error names the file and what is wrong with it.
    pub fn load(&self) -> Result<Loaded, String> {
        let chain = read_chain(&self.cert)?;
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| format!("no private key in {}: {e}", self.key.display()))?;
        let misfit = |e: rustls::Error| {
            format!(
                "the key {} does not fit the certificate {}: {e}",
                self.key.display(),
                self.cert.display()
            )
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match &self.ca {
            Some(ca) => Some(Arc::new(read_roots(ca)?)),
            None => None,
        };
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let server = match &roots {
            // A client may show a certificate (a node does) or not (a client of the queue); one
            // it shows must chain to the cluster's CA, or the handshake fails.
            Some(roots) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    Arc::clone(roots),
                    Arc::clone(&provider),
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("the cluster CA: {e}"))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        }
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(misfit)?;
        let nodes = match roots {
            Some(roots) => Some(Arc::new(
                ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("TLS: {e}"))?
                    .with_root_certificates(roots)
                    .with_client_auth_cert(chain, key)
                    .map_err(misfit)?,
            )),
            None => None,
        };
        Ok(Loaded {
            server: Arc::new(server),
            nodes,
        })
    }
}

/// The certificates of a CA file, as trust anchors.
fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in read_chain(path)? {
        roots
            .add(cert)
            .map_err(|e| format!("a certificate in {} is no CA: {e}", path.display()))?;
    }
    Ok(roots)
}

/// Every certificate in a PEM file, in order; an empty file is an error.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let chain = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(chain)
}

/// A connection's socket: plain, waiting for its first byte to say which, or TLS.
#[derive(Debug)]
pub struct Stream {
    tcp: TcpStream,
    state: State,
}

#[derive(Debug)]
enum State {
    Plain,
    /// A port with TLS on, before the client's first byte: a ClientHello starts TLS with this
    /// configuration; anything else is plain, or refused when TLS is `required`.
    Sniff {
        cfg: Arc<ServerConfig>,
        required: bool,
    },
    Tls(Box<Connection>),
    /// A plain client on a `required` port: nothing more is read; what the loop writes (its
    /// refusal) goes out in the clear.
    Refused,
}

impl Stream {
    /// A plain connection.
    pub fn plain(tcp: TcpStream) -> Stream {
        Stream {
            tcp,
            state: State::Plain,
        }
    }

    /// This node's connection to another node at `addr`, over TLS with `cfg` (its certificate
    /// shown, the other's checked against the cluster CA and `addr`'s IP address).
    pub fn to_node(
        tcp: TcpStream,
        cfg: &Arc<ClientConfig>,
        addr: std::net::SocketAddr,
    ) -> io::Result<Stream> {
        let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let mut conn = ClientConnection::new(Arc::clone(cfg), name).map_err(io::Error::other)?;
        conn.set_buffer_limit(None);
        Ok(Stream {
            tcp,
            state: State::Tls(Box::new(Connection::Client(conn))),
        })
    }

    /// Whether the other end showed a certificate that chains to the cluster CA (a TLS client
    /// shows one only when asked, and the port asks only with `--tls-ca`; one that does not
    /// chain fails the handshake).
    pub fn peer_is_node(&self) -> bool {
        match &self.state {
            State::Tls(c) => c.peer_certificates().is_some_and(|c| !c.is_empty()),
            _ => false,
        }
    }

    /// A connection on a port whose TLS is `mode`, with `cfg` (absent when the mode is off).
    pub fn accepted(tcp: TcpStream, mode: TlsMode, cfg: Option<&Arc<ServerConfig>>) -> Stream {
        let state = match (mode, cfg) {
            (TlsMode::Off, _) | (_, None) => State::Plain,
            (mode, Some(cfg)) => State::Sniff {
                cfg: Arc::clone(cfg),
                required: mode == TlsMode::Required,
            },
        };
        Stream { tcp, state }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Whether the client's first byte is still awaited (nothing is written meanwhile).
    pub fn undecided(&self) -> bool {
        matches!(self.state, State::Sniff { .. })
    }

    /// Whether it speaks TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self.state, State::Tls(_))
    }

    /// Whether a plain client was refused on a `required` port (by its first byte, or by
    /// [`settle_without_hello`](Self::settle_without_hello)).
    pub fn refused(&self) -> bool {
        matches!(self.state, State::Refused)
    }

    /// No ClientHello came in time (IPROTO's wait): plain on an optional port, refused on a
    /// required one. True when refused.
    pub fn settle_without_hello(&mut self) -> bool {
        match self.state {
            State::Sniff { required: true, .. } => self.state = State::Refused,
            State::Sniff { .. } => self.state = State::Plain,
            _ => {}
        }
        self.refused()
    }

    /// A short read may leave records in rustls or the socket: read on until `WouldBlock`.
    pub fn reads_to_block(&self) -> bool {
        !matches!(self.state, State::Plain)
    }

    /// TLS records wait for room in the socket.
    pub fn wants_write(&self) -> bool {
        match &self.state {
            State::Tls(c) => c.wants_write(),
            _ => false,
        }
    }

    /// Writes the TLS records waiting for room, until they are out or the socket is full.
    pub fn flush_tls(&mut self) -> io::Result<()> {
        match &mut self.state {
            State::Tls(c) => write_records(c, &mut self.tcp),
            _ => Ok(()),
        }
    }

    /// Queues TLS's close_notify after what was written, so the client tells an orderly close
    /// from a cut connection; the flush phase writes it.
    pub fn close_notify(&mut self) {
        if let State::Tls(c) = &mut self.state {
            c.send_close_notify();
            let _ = self.flush_tls();
        }
    }

    pub fn shutdown(&self, how: std::net::Shutdown) -> io::Result<()> {
        self.tcp.shutdown(how)
    }

    /// The first byte decides: TLS, plain, or refused. `WouldBlock` until one arrives.
    fn sniff(&mut self) -> io::Result<()> {
        let State::Sniff { cfg, required } = &self.state else {
            return Ok(());
        };
        let mut first = [0u8; 1];
        let n = loop {
            match self.tcp.peek(&mut first) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        self.state = if n == 0 {
            // Closed before a byte: nothing to decide, the read sees the end.
            State::Plain
        } else if first[0] == TLS_HANDSHAKE_RECORD {
            let mut conn = ServerConnection::new(Arc::clone(cfg)).map_err(io::Error::other)?;
            // Bounded by `write` instead: it hands rustls a chunk only once the socket took
            // the records before it.
            conn.set_buffer_limit(None);
            State::Tls(Box::new(Connection::Server(conn)))
        } else if *required {
            State::Refused
        } else {
            State::Plain
        };
        Ok(())
    }

    fn read_tls(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let State::Tls(c) = &mut self.state else {
            unreachable!("read_tls on a stream without TLS");
        };
        loop {
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The peer closed without close_notify: an end of stream like any other here
                // (a truncated reply matters to the client, not to the server).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            match c.read_tls(&mut self.tcp) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
            if let Err(e) = c.process_new_packets() {
                // Best effort: the alert rustls queued tells the client why.
                let _ = c.write_tls(&mut self.tcp);
                return Err(io::Error::new(io::ErrorKind::InvalidData, explain(&e)));
            }
            // The handshake's answers go out now; what does not fit waits for `flush_tls`.
            write_records(c, &mut self.tcp)?;
        }
    }
}

/// A TLS failure as the log shows it: rustls's words, and for an alert the other end sent about
/// this end's certificate, which this end cannot see for itself, what it means.
fn explain(e: &rustls::Error) -> String {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::AlertReceived(
            A::UnknownCA | A::BadCertificate | A::CertificateUnknown | A::CertificateRequired,
        ) => format!(
            "TLS: {e}: the other end did not accept this end's certificate (one signed by \
             another CA than the one it trusts, or none)"
        ),
        e => format!("TLS: {e}"),
    }
}

/// Writes `c`'s records waiting for room, until they are out or `tcp` is full.
fn write_records(c: &mut Connection, tcp: &mut TcpStream) -> io::Result<()> {
    while c.wants_write() {
        match c.write_tls(tcp) {
            Ok(_) => {}
            // A connection still being made (this node's, to another) takes no byte yet.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected
                ) =>
            {
                return Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.undecided() {
            self.sniff()?;
        }
        match self.state {
            State::Plain => self.tcp.read(buf),
            State::Tls(_) => self.read_tls(buf),
            State::Refused => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a plain client on a port that requires TLS",
            )),
            State::Sniff { .. } => unreachable!("sniffed above"),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.state {
            State::Plain | State::Refused => self.tcp.write(buf),
            // Nothing goes out before the client's first byte says in what.
            State::Sniff { .. } => Err(io::ErrorKind::WouldBlock.into()),
            State::Tls(_) => {
                self.flush_tls()?;
                let State::Tls(c) = &mut self.state else {
                    unreachable!()
                };
                if c.wants_write() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                let n = c.writer().write(&buf[..buf.len().min(WRITE_CHUNK_BYTES)])?;
                self.flush_tls()?;
                Ok(n)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp.register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp.reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.tcp.deregister(registry)
    }
}

/// The loop's TLS state: the configuration new connections start from (replaced on SIGHUP;
/// open connections keep the one they started with) and the IPROTO connections waiting for
/// their ClientHello.
#[derive(Debug, Default)]
pub struct TlsPorts {
    pub config: Option<Arc<ServerConfig>>,
    /// This node's connections to other nodes (replication, shard links), with `--tls-ca`.
    pub nodes: Option<Arc<ClientConfig>>,
    /// (deadline, slot, generation) in order of deadline: every wait is as long, so the
    /// connections accepted first come due first (a reload that shortens the wait fires the
    /// queued ones late, never early).
    pub waits: std::collections::VecDeque<(tarq_engine::Micros, usize, u32)>,
}

impl TlsPorts {
    /// The configuration of `cfg`'s certificate, when a port serves TLS.
    pub fn load(cfg: &crate::config::TlsConfig) -> Result<TlsPorts, String> {
        let loaded = match &cfg.files {
            Some(files) if cfg.any() => Some(files.load()?),
            _ => None,
        };
        Ok(TlsPorts {
            config: loaded.as_ref().map(|l| Arc::clone(&l.server)),
            nodes: loaded.and_then(|l| l.nodes),
            waits: Default::default(),
        })
    }

    /// The soonest hello wait to end.
    pub fn next_wait(&self) -> Option<tarq_engine::Micros> {
        self.waits.front().map(|w| w.0)
    }
}

impl super::Server {
    /// IPROTO connections whose ClientHello did not come in time: plain on an `optional` port
    /// (the greeting goes out now), refused on a `required` one.
    pub(super) fn end_hello_waits(&mut self) {
        while let Some(&(at, idx, gen)) = self.tls.waits.front() {
            if at > self.mono {
                break;
            }
            self.tls.waits.pop_front();
            let Some(c) = self.conns.get_mut(idx).filter(|c| c.gen == gen) else {
                continue;
            };
            if !c.stream.undecided() || c.closing.is_some() {
                continue;
            }
            if c.stream.settle_without_hello() {
                self.refuse_plain(idx);
            } else {
                self.conns.mark_flush(idx);
            }
        }
        self.timers
            .set(super::Timer::TlsHello, self.tls.next_wait());
    }

    /// A plain client on a port that requires TLS: told so in its protocol's terms where it has
    /// them, in the clear, and closed. IPROTO gets its greeting and an error (as a connection
    /// over the limit does), HTTP a 400 (as nginx answers plain HTTP on an HTTPS port);
    /// beanstalk has no such answer and is closed.
    pub(super) fn refuse_plain(&mut self, idx: usize) {
        let c = &mut self.conns[idx];
        let peer = c.peer;
        let port = match &c.proto {
            super::Protocol::Http(_) => {
                c.out.out.clear();
                crate::frontend::http::refusal(
                    &mut c.out.out,
                    400,
                    "This port requires TLS: use https://",
                );
                "http-tls"
            }
            super::Protocol::Beanstalk(_) => "beanstalk-tls",
            _ => {
                let text = "This port requires TLS (listen-tls = required): connect with \
                            TLS (transport='ssl')";
                tarq_iproto::response::error(&mut c.out.out, 0, super::enforce::ER_UNKNOWN, text);
                "listen-tls"
            }
        };
        // Released as written: no durability stands behind a refusal.
        c.out.hold(0);
        c.out.release(0);
        let flush = port != "beanstalk-tls";
        tracing::warn!(%peer, setting = port, "plain connection refused: the port requires TLS");
        self.begin_close(idx, "plain client on a TLS port", flush);
    }

    /// Why connection `idx` may not carry node-to-node traffic (replication, a shard link), or
    /// `None`: with a cluster CA, only a TLS connection whose certificate the CA signed may.
    pub(super) fn node_refusal(&self, idx: usize) -> Option<String> {
        node_refusal(self.tls.nodes.is_some(), &self.conns[idx])
    }

    /// SIGHUP: the certificate and key are read again; new connections get them, open ones
    /// keep what they started with. A file that does not read keeps the running ones.
    pub(super) fn reload_certificate(&mut self) {
        let Some(files) = self.cfg.tls.files.clone().filter(|_| self.cfg.tls.any()) else {
            return;
        };
        match files.load() {
            Ok(loaded) => {
                self.tls.config = Some(loaded.server);
                self.tls.nodes = loaded.nodes;
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => tracing::warn!(
                error = %e,
                "TLS certificate not reloaded: new connections keep getting the running one"
            ),
        }
    }
}

/// Why connection `c` may not carry node-to-node traffic, or `None`: with a cluster CA
/// (`nodes_signed`), only a TLS connection whose certificate the CA signed may.
pub(super) fn node_refusal(nodes_signed: bool, c: &super::conn::Conn) -> Option<String> {
    if !nodes_signed || c.stream.peer_is_node() {
        return None;
    }
    let how = if c.stream.is_tls() {
        "a TLS connection without a certificate"
    } else {
        "a plain connection"
    };
    Some(format!(
        "nodes talk over TLS with a certificate the cluster CA signed (tls-ca); this is {how}"
    ))
}
