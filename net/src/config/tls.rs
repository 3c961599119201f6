//! TLS as the operator set it: each client port's mode ([`TlsMode`]), the certificate, key and
//! cluster CA files ([`TlsFiles`]), and the ClientHello wait. Reading the files and serving TLS
//! are the server's (`crate::server::tls`).

use std::path::PathBuf;

use tarq_engine::Micros;

/// What a port does with TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP only.
    #[default]
    Off,
    /// TLS for clients that start it, plain for the others.
    Optional,
    /// TLS only: a plain client is refused.
    Required,
}

impl std::str::FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(TlsMode::Off),
            "optional" => Ok(TlsMode::Optional),
            "required" => Ok(TlsMode::Required),
            _ => Err(format!(
                "{s:?} is not a TLS mode: off, optional or required"
            )),
        }
    }
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::Optional => "optional",
            TlsMode::Required => "required",
        })
    }
}

/// Where the server's certificate chain and key are (PEM), and the cluster's CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own first.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signs the cluster's nodes (`--tls-ca`): when set, replication and shard
    /// links run over TLS with both ends' certificates checked against it.
    pub ca: Option<PathBuf>,
}

/// Default `--tls-hello-wait`: a TLS client sends its ClientHello as soon as its connect
/// returns, microseconds after the server accepts; a fifth of a second covers a client
/// scheduled late on a loaded machine, and is what a plain IPROTO client on an `optional`
/// port waits for its greeting.
pub const DEFAULT_TLS_HELLO_WAIT: Micros = 200_000;

/// TLS on the client ports: each port's mode, and the certificate and key they serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    pub iproto: TlsMode,
    pub beanstalk: TlsMode,
    pub http: TlsMode,
    /// The certificate chain and key, when TLS is on anywhere.
    pub files: Option<TlsFiles>,
    /// How long an IPROTO connection on a TLS port may take to send its ClientHello (µs).
    pub hello_wait: Micros,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            iproto: TlsMode::Off,
            beanstalk: TlsMode::Off,
            http: TlsMode::Off,
            files: None,
            hello_wait: DEFAULT_TLS_HELLO_WAIT,
        }
    }
}

impl TlsConfig {
    /// Whether any port serves TLS.
    pub fn any(&self) -> bool {
        [self.iproto, self.beanstalk, self.http]
            .iter()
            .any(|&m| m != TlsMode::Off)
    }
}
