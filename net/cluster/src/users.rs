//! The users of a sharded cluster, kept in etcd so that every replica set has them: one key,
//! `/tarq/<cluster>/users`, holding the whole table as a JSON object of user name → record.
//! The records are the loop's (`tarq-net` writes and reads them); this crate only stores them,
//! changes one at a time, and reads the table with each poll.
//!
//! A change is a read-modify-write under a compare on the key's mod revision, retried when
//! another node changed the table in between, so two administrators changing two users on two
//! nodes at once both land. A primary that finds the key never written seeds it with the users
//! it holds (`UsersChange::Seed`), so a cluster whose sets had users before it kept them in
//! etcd keeps them all.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::etcd::{Client, Compare, EtcdError, Kv, Op};

/// The table: user name → its record (the loop's JSON).
pub type UsersTable = BTreeMap<String, serde_json::Value>;

/// The table as read, with the key's mod revision (0: never written).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsersRead {
    pub revision: i64,
    pub table: UsersTable,
}

/// A change of the table the loop asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum UsersChange {
    /// Adds or replaces user `name` with `record`.
    Put {
        name: String,
        record: serde_json::Value,
    },
    /// Removes user `name` (nothing if absent).
    Drop { name: String },
    /// Adds the users of `table` that the cluster's lacks: what a primary that found the key
    /// never written holds (two sets' primaries may both find it so; both sets' users stay,
    /// the first seeder's record where a name is in both).
    Seed(UsersTable),
}

/// Why a change of the cluster's users was not done, or may not have been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsersError {
    /// etcd did not answer: the change may have been made, its answer lost.
    Etcd(String),
    /// Refused before anything was written (the table damaged, or changed under every try).
    Refused(String),
}

/// Times a change is tried when other nodes keep changing the table under it.
const ATTEMPTS: usize = 8;

/// The etcd key holding `cluster`'s users.
pub fn key_of(cluster: &str) -> Vec<u8> {
    format!("/tarq/{cluster}/users").into_bytes()
}

/// The table in `kv` (an absent key is an empty table never written). `Err`: the key holds
/// something other than a JSON object (edited by hand).
pub fn parse(kv: Option<&Kv>) -> Result<UsersRead, String> {
    let Some(kv) = kv else {
        return Ok(UsersRead::default());
    };
    let table = serde_json::from_slice(&kv.value)
        .map_err(|e| format!("the users key holds no table of users: {e}"))?;
    Ok(UsersRead {
        revision: kv.mod_revision,
        table,
    })
}

/// Makes `change` in `cluster`'s table. The inner `Err`: the stored table is damaged, or other
/// nodes changed it on every attempt.
pub fn change(
    client: &mut Client,
    cluster: &str,
    change: &UsersChange,
    budget: Duration,
) -> Result<Result<(), String>, EtcdError> {
    let key = key_of(cluster);
    let deadline = Instant::now() + budget;
    for _ in 0..ATTEMPTS {
        let left = deadline.saturating_duration_since(Instant::now());
        let reply = client.txn(&[], &[Op::Get(key.clone())], &[], left)?;
        let kv = reply.ranges.into_iter().flatten().next();
        let read = match parse(kv.as_ref()) {
            Ok(read) => read,
            Err(why) => return Ok(Err(why)),
        };
        let mut table = read.table;
        match change {
            UsersChange::Put { name, record } => {
                table.insert(name.clone(), record.clone());
            }
            UsersChange::Drop { name } => {
                table.remove(name);
            }
            // Another set seeded first: its users stay, and this set's others join them.
            UsersChange::Seed(seed) => {
                if seed.keys().all(|name| table.contains_key(name)) && read.revision != 0 {
                    return Ok(Ok(()));
                }
                for (name, record) in seed {
                    table.entry(name.clone()).or_insert_with(|| record.clone());
                }
            }
        }
        let value = serde_json::to_vec(&table).expect("a JSON object serializes");
        let left = deadline.saturating_duration_since(Instant::now());
        let put = Op::Put {
            key: key.clone(),
            value,
            lease: 0,
        };
        let fence = [Compare::ModRevision(key.clone(), read.revision)];
        if client.txn(&fence, &[put], &[], left)?.succeeded {
            return Ok(Ok(()));
        }
    }
    Ok(Err(format!(
        "the cluster's users changed under this change {ATTEMPTS} times in a row; try again"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_key_is_an_empty_table_never_written_and_a_damaged_one_is_named() {
        assert_eq!(parse(None), Ok(UsersRead::default()));
        let kv = |value: &[u8]| Kv {
            key: key_of("c"),
            value: value.to_vec(),
            create_revision: 3,
            mod_revision: 7,
            lease: 0,
        };
        let read = parse(Some(&kv(br#"{"bob": {"admin": false}}"#))).unwrap();
        assert_eq!(read.revision, 7);
        assert_eq!(read.table["bob"]["admin"], false);
        let err = parse(Some(&kv(b"[1]"))).unwrap_err();
        assert!(err.contains("no table of users"), "{err}");
    }
}
