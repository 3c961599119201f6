//! A small blocking client for the part of etcd's v3 API that leader election needs: lease
//! grant / keep-alive / revoke, range, and transactions with compares, spoken as JSON to the
//! gRPC gateway every etcd server serves on its client port (`/v3/...`, keys and values in
//! base64, 64-bit integers as decimal strings). Every call takes its own time budget, so the
//! caller decides how long it may block; a transport failure moves on to the next endpoint.
//! What to do with the answers is `node`'s business.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::{json, Value};

/// Longest reply body read from etcd. The whole placement is the largest reply this crate asks
/// for: at most 4095 index keys and as many partitions in tube keys, some 1.5 MB in the
/// gateway's base64 with each key's revisions, below this; member keys are a few hundred bytes
/// each.
const MAX_REPLY_BYTES: u64 = 4 << 20;

/// Why a call to etcd failed.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd at {endpoint} unreachable: {message}")]
    Transport { endpoint: String, message: String },
    #[error("etcd at {endpoint} answered HTTP {status} to {path}: {message}")]
    Status {
        endpoint: String,
        path: &'static str,
        status: u16,
        message: String,
    },
    #[error("etcd at {endpoint} sent a reply to {path} that does not parse ({reason}): {body}")]
    Malformed {
        endpoint: String,
        path: &'static str,
        reason: String,
        body: String,
    },
}

/// A granted lease: its id and the TTL etcd granted, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub id: i64,
    pub ttl_secs: i64,
}

/// One key-value pair as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Kv {
    #[serde(deserialize_with = "b64_bytes")]
    pub key: Vec<u8>,
    #[serde(default, deserialize_with = "b64_bytes")]
    pub value: Vec<u8>,
    #[serde(default, deserialize_with = "int")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "int")]
    pub mod_revision: i64,
    #[serde(default, deserialize_with = "int")]
    pub lease: i64,
}

/// A condition of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key's create revision equals this (0: the key does not exist).
    CreateRevision(Vec<u8>, i64),
    /// The key's last modification was at this revision (0: the key does not exist).
    ModRevision(Vec<u8>, i64),
    /// The key is bound to this lease.
    Lease(Vec<u8>, i64),
    /// Every key under the prefix was last modified before this revision (none changed or
    /// appeared at or after it).
    ModifiedBefore { prefix: Vec<u8>, revision: i64 },
}

/// An operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    },
    Get(Vec<u8>),
    GetPrefix(Vec<u8>),
    Delete(Vec<u8>),
}

/// What a transaction did: which branch ran, at which store revision, and the key-value
/// pairs of each range operation of that branch, in order (empty for puts and deletes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnReply {
    pub succeeded: bool,
    pub revision: i64,
    pub ranges: Vec<Vec<Kv>>,
}

/// A connection pool over the configured endpoints.
pub struct Client {
    agent: ureq::Agent,
    endpoints: Vec<String>,
    current: usize,
}

impl Client {
    /// `endpoints` are base URLs like `http://127.0.0.1:2379`, already checked by the config.
    pub fn new(endpoints: Vec<String>) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        Client {
            agent,
            endpoints,
            current: 0,
        }
    }

    /// [`new`](Self::new), speaking TLS to `https://` endpoints as `tls` says: etcd's
    /// certificate checked against its CA, this node's shown when given. The error names the
    /// file that does not read.
    pub fn with_tls(
        endpoints: Vec<String>,
        tls: Option<&crate::config::EtcdTls>,
    ) -> Result<Client, crate::ConfigError> {
        let Some(tls) = tls else {
            return Ok(Client::new(endpoints));
        };
        use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig};
        let read = |p: &std::path::Path| {
            std::fs::read(p)
                .map_err(|e| crate::ConfigError::Tls(format!("cannot read {}: {e}", p.display())))
        };
        let certs = |p: &std::path::Path| -> Result<Vec<Certificate<'static>>, crate::ConfigError> {
            let pem = read(p)?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|i| match i {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                let why = format!("no certificate in {}", p.display());
                return Err(crate::ConfigError::Tls(why));
            }
            Ok(certs)
        };
        let mut config = TlsConfig::builder()
            .root_certs(RootCerts::new_with_certs(&certs(&tls.ca)?))
            // ureq is built without a crypto provider of its own: rustls's ring, as the ports'.
            .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ));
        if let Some((cert, key)) = &tls.client {
            let pem = read(key)?;
            let key = PrivateKey::from_pem(&pem).map_err(|e| {
                crate::ConfigError::Tls(format!("no private key in {}: {e}", key.display()))
            })?;
            config = config.client_cert(Some(ClientCert::new_with_certs(&certs(cert)?, key)));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(config.build())
            .build()
            .into();
        Ok(Client {
            agent,
            endpoints,
            current: 0,
        })
    }

    /// A client over endpoints as a user writes them (`http://host:port` or `host:port`),
    /// checked as `Config` checks them: for tools (`tarq ctl`) that talk to etcd without an
    /// election thread. An `https://` endpoint needs `tls` (its CA), as a node's does.
    pub fn connect(endpoints: &[String]) -> Result<Client, crate::ConfigError> {
        Client::connect_tls(endpoints, None)
    }

    /// [`connect`](Self::connect) with etcd's TLS settings.
    pub fn connect_tls(
        endpoints: &[String],
        tls: Option<&crate::config::EtcdTls>,
    ) -> Result<Client, crate::ConfigError> {
        let urls = crate::config::base_urls(endpoints)?;
        if tls.is_none() {
            if let Some(https) = urls.iter().find(|u| u.starts_with("https://")) {
                return Err(crate::ConfigError::NeedsCa(https.clone()));
            }
        }
        Client::with_tls(urls, tls)
    }

    /// The endpoint the next call goes to.
    pub fn endpoint(&self) -> &str {
        &self.endpoints[self.current]
    }

    pub fn grant(&mut self, ttl_secs: i64, budget: Duration) -> Result<Granted, EtcdError> {
        #[derive(Deserialize)]
        struct Reply {
            #[serde(rename = "ID", deserialize_with = "int")]
            id: i64,
            #[serde(rename = "TTL", deserialize_with = "int")]
            ttl: i64,
        }
        let reply: Reply = self.call("/v3/lease/grant", json!({ "TTL": ttl_secs }), budget)?;
        Ok(Granted {
            id: reply.id,
            ttl_secs: reply.ttl,
        })
    }

    /// Refreshes a lease; `Ok(None)` when etcd no longer has it (expired or revoked).
    pub fn keep_alive(&mut self, id: i64, budget: Duration) -> Result<Option<i64>, EtcdError> {
        #[derive(Deserialize)]
        struct Reply {
            result: Inner,
        }
        #[derive(Deserialize)]
        struct Inner {
            #[serde(rename = "TTL", default, deserialize_with = "int")]
            ttl: i64,
        }
        let body = json!({ "ID": id.to_string() });
        let reply: Reply = self.call("/v3/lease/keepalive", body, budget)?;
        Ok((reply.result.ttl > 0).then_some(reply.result.ttl))
    }

    /// Revokes a lease, deleting every key bound to it; a lease etcd no longer has counts as
    /// revoked.
    pub fn revoke(&mut self, id: i64, budget: Duration) -> Result<(), EtcdError> {
        let body = json!({ "ID": id.to_string() });
        match self.call::<Value>("/v3/lease/revoke", body, budget) {
            Ok(_) => Ok(()),
            Err(EtcdError::Status { message, .. }) if message.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub fn txn(
        &mut self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
        budget: Duration,
    ) -> Result<TxnReply, EtcdError> {
        #[derive(Deserialize)]
        struct Reply {
            header: Header,
            #[serde(default)]
            succeeded: bool,
            #[serde(default)]
            responses: Vec<OpReply>,
        }
        #[derive(Deserialize)]
        struct OpReply {
            response_range: Option<RangeReply>,
        }
        #[derive(Deserialize)]
        struct RangeReply {
            #[serde(default)]
            kvs: Vec<Kv>,
        }
        let body = json!({
            "compare": compare.iter().map(compare_json).collect::<Vec<_>>(),
            "success": success.iter().map(op_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(op_json).collect::<Vec<_>>(),
        });
        let reply: Reply = self.call("/v3/kv/txn", body, budget)?;
        Ok(TxnReply {
            succeeded: reply.succeeded,
            revision: reply.header.revision,
            ranges: reply
                .responses
                .into_iter()
                .filter_map(|r| r.response_range.map(|r| r.kvs))
                .collect(),
        })
    }

    /// One POST with its JSON body; a transport failure moves to the next endpoint so the
    /// following call tries another member of the etcd cluster.
    fn call<T: de::DeserializeOwned>(
        &mut self,
        path: &'static str,
        body: Value,
        budget: Duration,
    ) -> Result<T, EtcdError> {
        let endpoint = self.endpoint().to_owned();
        let url = format!("{endpoint}{path}");
        let sent = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(budget))
            .build()
            .header("content-type", "application/json")
            .send(body.to_string());
        let transport = |e: ureq::Error| EtcdError::Transport {
            endpoint: endpoint.clone(),
            message: e.to_string(),
        };
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => {
                self.current = (self.current + 1) % self.endpoints.len();
                return Err(transport(e));
            }
        };
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_REPLY_BYTES)
            .read_to_string()
            .map_err(|e| {
                self.current = (self.current + 1) % self.endpoints.len();
                transport(e)
            })?;
        if status != 200 {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or(text);
            return Err(EtcdError::Status {
                endpoint,
                path,
                status,
                message,
            });
        }
        serde_json::from_str(&text).map_err(|e| EtcdError::Malformed {
            endpoint,
            path,
            reason: e.to_string(),
            body: text,
        })
    }
}

#[derive(Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "int")]
    revision: i64,
}

/// The first key after every key that starts with `prefix`: etcd's `range_end` for a prefix.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only for a prefix of all 0xff bytes: "\0" means "to the end of the keyspace".
    vec![0]
}

fn compare_json(c: &Compare) -> Value {
    match c {
        Compare::CreateRevision(key, rev) => json!({
            "key": B64.encode(key), "target": "CREATE", "result": "EQUAL",
            "create_revision": rev.to_string(),
        }),
        Compare::ModRevision(key, rev) => json!({
            "key": B64.encode(key), "target": "MOD", "result": "EQUAL",
            "mod_revision": rev.to_string(),
        }),
        Compare::Lease(key, lease) => json!({
            "key": B64.encode(key), "target": "LEASE", "result": "EQUAL",
            "lease": lease.to_string(),
        }),
        Compare::ModifiedBefore { prefix, revision } => json!({
            "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)),
            "target": "MOD", "result": "LESS", "mod_revision": revision.to_string(),
        }),
    }
}

fn op_json(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => json!({ "request_put": {
            "key": B64.encode(key), "value": B64.encode(value), "lease": lease.to_string(),
        }}),
        Op::Get(key) => json!({ "request_range": { "key": B64.encode(key) } }),
        Op::GetPrefix(prefix) => json!({ "request_range": {
            "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)),
        }}),
        Op::Delete(key) => json!({ "request_delete_range": { "key": B64.encode(key) } }),
    }
}

/// A 64-bit integer the gateway sends as a decimal string (or, leniently, as a number).
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => s.parse().map_err(de::Error::custom),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| de::Error::custom(format!("{n} is not a 64-bit integer"))),
        other => Err(de::Error::custom(format!(
            "expected an integer, got {other}"
        ))),
    }
}

fn b64_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = String::deserialize(d)?;
    B64.decode(s.as_bytes()).map_err(de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_that_can_be() {
        assert_eq!(prefix_end(b"/tarq/a/members/"), b"/tarq/a/members0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn kv_parses_the_gateway_shape() {
        let kv: Kv = serde_json::from_str(
            r#"{"key":"L2w=","create_revision":"2","mod_revision":"3","version":"1","value":"dg==","lease":"41"}"#,
        )
        .unwrap();
        assert_eq!(
            kv,
            Kv {
                key: b"/l".to_vec(),
                value: b"v".to_vec(),
                create_revision: 2,
                mod_revision: 3,
                lease: 41,
            }
        );
        let bad = serde_json::from_str::<Kv>(r#"{"key":"L2w=","create_revision":"x"}"#);
        assert!(bad.unwrap_err().to_string().contains("invalid digit"));
    }
}
