//! TLS for the load connections (`--tls-ca`), to measure what TLS costs the server: each
//! connection shakes hands (TLS, then its protocol's greeting) blocking, as a plain one does,
//! then runs non-blocking in the loop through [`Stream`], which reads and writes plaintext
//! as a `TcpStream` would: `WouldBlock` when the socket has nothing, or takes nothing more.
//! rustls does the TLS (its sans-IO client fits the mio loop); this file only moves bytes.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// Plaintext a connection buffers before a write says "would block": about what a socket's
/// send buffer holds, so a TLS connection pushes back on the loop as a plain one does.
const BUFFER_LIMIT: usize = 256 * 1024;

/// A client configuration trusting the CA certificates in `ca` (PEM) only.
pub fn client_config(ca: &Path) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", ca.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", ca.display());
    }
    for c in certs {
        roots
            .add(c)
            .with_context(|| format!("a certificate in {} is no CA", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Shakes hands over the blocking `tcp` (its timeouts bound it) with the server at `addr`,
/// checked against `addr`'s IP address: the TLS session, ready for the protocol's greeting.
pub fn handshake(
    tcp: std::net::TcpStream,
    addr: SocketAddr,
    cfg: &Arc<ClientConfig>,
) -> Result<rustls::StreamOwned<ClientConnection, std::net::TcpStream>> {
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = ClientConnection::new(Arc::clone(cfg), name).context("a TLS client")?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .with_context(|| format!("TLS handshake with {addr}"))?;
    }
    Ok(s)
}

/// A load connection's socket, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// A TLS session over a non-blocking socket.
pub struct TlsStream {
    tcp: TcpStream,
    conn: ClientConnection,
}

impl Stream {
    /// The loop's side of a blocking TLS session that has shaken hands (its socket is made
    /// non-blocking by the caller).
    pub fn tls(s: rustls::StreamOwned<ClientConnection, std::net::TcpStream>) -> Stream {
        let (mut conn, tcp) = (s.conn, s.sock);
        conn.set_buffer_limit(Some(BUFFER_LIMIT));
        Stream::Tls(Box::new(TlsStream {
            tcp: TcpStream::from_std(tcp),
            conn,
        }))
    }

    fn tcp(&mut self) -> &mut TcpStream {
        match self {
            Stream::Plain(t) => t,
            Stream::Tls(t) => &mut t.tcp,
        }
    }
}

impl TlsStream {
    /// Writes what TLS holds for the socket until it would block.
    fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.conn.reader().read(buf) {
                // Plaintext, or the server's close_notify (0).
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            // Nothing decrypted yet: more records from the socket.
            match self.conn.read_tls(&mut self.tcp)? {
                0 => return Ok(0),
                _ => {
                    self.conn.process_new_packets().map_err(io::Error::other)?;
                    // A reply the session owes (a key update) goes out with the next write.
                }
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.flush_tls()?;
        let n = self.conn.writer().write(buf)?;
        self.flush_tls()?;
        if n == 0 && !buf.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(t) => t.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(t) => t.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

impl mio::event::Source for Stream {
    fn register(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp().register(registry, token, interests)
    }

    fn reregister(
        &mut self,
        registry: &mio::Registry,
        token: mio::Token,
        interests: mio::Interest,
    ) -> io::Result<()> {
        self.tcp().reregister(registry, token, interests)
    }

    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.tcp().deregister(registry)
    }
}
