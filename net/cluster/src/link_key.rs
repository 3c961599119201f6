//! The cluster's **link key**: a random secret kept in etcd that the nodes of a sharded
//! cluster prove they know when one opens a link to another. Links carry forwarded calls, the
//! ends of sessions and partition moves, so whoever may open one acts for every node; the key
//! confines that to processes that can read the cluster's etcd, which clients of a node's
//! IPROTO port cannot. It needs no setting: the first node to read the cluster finds the key
//! absent and creates it; every later node reads the same one.
//!
//! Key `/tarq/<cluster>/link-key`: 32 random bytes as 64 hex digits, written only by a
//! create-if-absent transaction, so racing first nodes agree on one key. Replacing it (delete
//! the key, then restart the nodes) is the way to shut out a node that should no longer link.

use std::fmt;
use std::time::Duration;

use crate::etcd::{Client, Compare, EtcdError, Op};

/// Bytes of the key.
pub const LINK_KEY_LEN: usize = 32;

/// The cluster's link key. Its `Debug` does not print it: overviews are logged.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct LinkKey(pub [u8; LINK_KEY_LEN]);

impl fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

/// The etcd key holding `cluster`'s link key.
pub fn key_of(cluster: &str) -> Vec<u8> {
    format!("/tarq/{cluster}/link-key").into_bytes()
}

/// Reads `cluster`'s link key, creating it from `fresh` if it is absent. The inner `Err`: the
/// key holds something other than 64 hex digits (edited by hand), which no node can use.
pub fn ensure(
    client: &mut Client,
    cluster: &str,
    fresh: &LinkKey,
    budget: Duration,
) -> Result<Result<LinkKey, String>, EtcdError> {
    let key = key_of(cluster);
    let reply = client.txn(
        &[Compare::CreateRevision(key.clone(), 0)],
        &[
            Op::Put {
                key: key.clone(),
                value: crate::hex::encode(&fresh.0).into_bytes(),
                lease: 0,
            },
            Op::Get(key.clone()),
        ],
        &[Op::Get(key.clone())],
        budget,
    )?;
    let stored = reply.ranges.into_iter().flatten().next();
    let Some(kv) = stored else {
        return Ok(Err(
            "the link key is absent right after it was written".into()
        ));
    };
    Ok(parse(&kv.value).ok_or_else(|| {
        format!(
            "etcd key {} does not hold 64 hex digits; delete it for the nodes to make a new one",
            String::from_utf8_lossy(&key)
        )
    }))
}

/// `cluster`'s link key as etcd has it now: `None` while no node has made it yet.
pub fn read(
    client: &mut Client,
    cluster: &str,
    budget: Duration,
) -> Result<Option<LinkKey>, EtcdError> {
    let reply = client.txn(&[], &[Op::Get(key_of(cluster))], &[], budget)?;
    let stored = reply.ranges.into_iter().flatten().next();
    Ok(stored.and_then(|kv| parse(&kv.value)))
}

fn parse(text: &[u8]) -> Option<LinkKey> {
    crate::hex::decode(std::str::from_utf8(text).ok()?).map(LinkKey)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_what_is_not_a_key() {
        let k = LinkKey(std::array::from_fn(|i| (i * 37) as u8));
        assert_eq!(parse(crate::hex::encode(&k.0).as_bytes()), Some(k));
        assert_eq!(parse(b"abc"), None);
        assert_eq!(parse(&[b'g'; 64]), None);
        assert_eq!(format!("{k:?}"), "LinkKey(..)");
    }
}
