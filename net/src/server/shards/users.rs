//! The users of a sharded cluster, the same in every replica set: etcd holds the cluster's
//! table (`tarq_cluster::users`), and each set's primary journals it, so its replicas, its
//! snapshots and its restarts have it as an unsharded node's users.
//!
//! A change (`box.schema.user.*`, `tube:grant`, `tarq ctl user`, the HTTP API) through any
//! node, primary or replica, is made in etcd first and answered once etcd has it; the node
//! applies it at once if it leads, and every primary applies whatever the table it reads says
//! (`shards_users_changed`: on each new revision, and when it becomes primary). The first
//! primary of a cluster whose table was never written seeds it with the users it holds, so a
//! cluster that had users before keeps them; after that, etcd's table wins over a set's own.

use serde_json::{json, Value};
use tarq_cluster::{UsersChange, UsersError, UsersTable};
use tarq_engine::users::{Rights, User, HASH_LEN};
use tracing::{info, warn};

use super::ctx::Ctx;
use super::{Client, Router};
use crate::core::{Command, Outcome, Refusal};

/// A user change waiting for etcd: who asked, and what to apply here once etcd has it.
pub(super) struct UserChange {
    pub client: Client,
    pub apply: Apply,
}

/// What a change does to this node's users.
pub(super) enum Apply {
    Put(User),
    Drop(String),
}

impl Router {
    /// A user change on a sharded node (`PutUser`, `DropUser`): checked here, made in etcd,
    /// answered by [`Self::shards_users_done`]. Any other command comes back to be routed.
    pub(super) fn change_user_placed<'c>(
        &mut self,
        cx: &mut Ctx<'_>,
        client: Client,
        cmd: Command<'c>,
    ) -> Option<Command<'c>> {
        let (change, apply) = match cmd {
            Command::PutUser { user } => {
                if let Err(e) = tarq_engine::users::check(cx.core.queue().users(), user) {
                    let refusal = Refusal::User(e.to_string());
                    self.answer(cx, client, &Outcome::Error(refusal));
                    return None;
                }
                let change = UsersChange::Put {
                    name: user.name.clone(),
                    record: record_of(user),
                };
                (change, Apply::Put(user.clone()))
            }
            Command::DropUser { name } => {
                let change = UsersChange::Drop {
                    name: name.to_owned(),
                };
                (change, Apply::Drop(name.to_owned()))
            }
            cmd => return Some(cmd),
        };
        let token = self.next_token;
        self.next_token += 1;
        self.user_changes
            .insert(token, UserChange { client, apply });
        let cluster = cx.cluster().expect("a sharded node is a cluster node");
        cluster.handle().change_users(token, change);
        None
    }

    /// etcd answered a user change this node asked for: applied here if this node leads
    /// (the others' primaries apply it as they read it), and answered.
    pub(crate) fn shards_users_done(
        &mut self,
        cx: &mut Ctx<'_>,
        token: u64,
        result: Result<(), UsersError>,
    ) {
        if self.seeding == Some(token) {
            self.seeding = None;
            match result {
                Ok(()) => info!("the cluster's users are seeded with this replica set's"),
                Err(why) => warn!(
                    ?why,
                    "seeding the cluster's users failed; tried again when this node next becomes primary or the table changes"
                ),
            }
            return;
        }
        let Some(UserChange { client, apply }) = self.user_changes.remove(&token) else {
            return;
        };
        let outcome = match result {
            Ok(()) => {
                if cx.leads() {
                    self.apply_user(cx, apply);
                }
                Outcome::Ok
            }
            // etcd may have taken the change and lost only its answer: not "not done".
            Err(UsersError::Etcd(e)) => Outcome::Error(Refusal::Unknown(format!(
                "the cluster's users may or may not have changed: etcd did not answer ({e}); \
                 list them to see"
            ))),
            Err(UsersError::Refused(why)) => Outcome::Error(Refusal::Shards(format!(
                "the cluster's users were not changed: {why}"
            ))),
        };
        self.answer(cx, client, &outcome);
    }

    /// The cluster's users as etcd last said, made this set's on its primary: each user that
    /// differs is journaled, each one etcd lacks dropped. A table never written is seeded with
    /// this set's users instead (once, by whichever primary gets there first).
    pub(crate) fn shards_users_changed(&mut self, cx: &mut Ctx<'_>) {
        if !cx.leads() {
            return;
        }
        let Some(cluster) = cx.cluster() else {
            return;
        };
        let read = cluster.handle().users();
        let local = cx.core.queue().users();
        if read.revision == 0 {
            if local.is_empty() || self.seeding.is_some() {
                return;
            }
            let table: UsersTable = (local.iter())
                .map(|u| (u.name.clone(), record_of(u)))
                .collect();
            let token = self.next_token;
            self.next_token += 1;
            self.seeding = Some(token);
            cluster
                .handle()
                .change_users(token, UsersChange::Seed(table));
            return;
        }
        let mut changes = Vec::new();
        for (name, record) in &read.table {
            match user_of(name, record) {
                Ok(user) if local.get(name) != Some(&user) => changes.push(Apply::Put(user)),
                Ok(_) => {}
                Err(why) => warn!(user = %name, %why, "a user of the cluster's table is damaged"),
            }
        }
        for u in local.iter().filter(|u| !read.table.contains_key(&u.name)) {
            changes.push(Apply::Drop(u.name.clone()));
        }
        if !changes.is_empty() {
            info!(
                revision = read.revision,
                changes = changes.len(),
                "the cluster's users applied"
            );
        }
        for change in changes {
            self.apply_user(cx, change);
        }
    }

    fn apply_user(&mut self, cx: &mut Ctx<'_>, apply: Apply) {
        let result = match apply {
            Apply::Put(user) => cx.core.put_user(user),
            Apply::Drop(name) => {
                cx.core.drop_user(&name);
                Ok(())
            }
        };
        if let Err(e) = result {
            warn!(error = %e, "a user of the cluster cannot be stored here");
        }
    }
}

/// A user as the cluster's table keeps it: the password's `sha1(sha1(...))` in hex (never the
/// password), the cluster's admin right, the rights by tube.
pub(super) fn record_of(user: &User) -> Value {
    let tubes: serde_json::Map<String, Value> = (user.tubes.iter())
        .map(|(t, r)| (t.clone(), Value::from(r.names())))
        .collect();
    let mut record = json!({
        "hash2": user.hash2.map(|h| tarq_cluster::hex::encode(&h)),
        "admin": user.admin,
        "tubes": tubes,
    });
    // A user's own limits only when it has them: the records of nodes that know none read
    // the same.
    let l = user.limits;
    for (key, value) in [
        ("max_connections", l.max_connections),
        ("put_rate", l.put_rate),
    ] {
        if let Some(n) = value {
            record[key] = Value::from(n);
        }
    }
    record
}

/// The user `name` of the table's `record`.
pub(super) fn user_of(name: &str, record: &Value) -> Result<User, String> {
    let mut user = User::new(name);
    user.hash2 = match &record["hash2"] {
        Value::Null => None,
        Value::String(h) => Some(
            tarq_cluster::hex::decode(h).ok_or(format!("hash2 {h:?} is not {HASH_LEN} bytes"))?,
        ),
        other => return Err(format!("hash2 {other}: hex or null")),
    };
    user.admin = record["admin"].as_bool().unwrap_or(false);
    let limit = |key: &str| match &record[key] {
        Value::Null => Ok(None),
        v => (v.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some))
            .ok_or(format!("{key} {v}: a whole number or none")),
    };
    user.limits.max_connections = limit("max_connections")?;
    user.limits.put_rate = limit("put_rate")?;
    if let Some(tubes) = record["tubes"].as_object() {
        for (tube, names) in tubes {
            let mut rights = Rights::NONE;
            for n in names.as_array().into_iter().flatten() {
                let right = n.as_str().and_then(Rights::named);
                rights = rights.union(right.ok_or(format!("tube {tube}: no right {n}"))?);
            }
            if !rights.is_empty() {
                user.tubes.insert(tube.clone(), rights);
            }
        }
    }
    Ok(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_round_trips_its_record_and_a_damaged_record_is_named() {
        let mut bob = User::new("bob");
        bob.hash2 = Some(tarq_iproto::auth::hash2("pw"));
        bob.tubes
            .insert("jobs".into(), Rights::PUT.union(Rights::TAKE));
        bob.tubes.insert("*".into(), Rights::ADMIN);
        let record = record_of(&bob);
        assert_eq!(record["tubes"]["jobs"], json!(["put", "take"]));
        assert_eq!(user_of("bob", &record), Ok(bob));
        let mut ops = User::new("ops");
        ops.admin = true;
        ops.limits.put_rate = Some(0);
        ops.limits.max_connections = Some(4);
        let record = record_of(&ops);
        assert_eq!(
            (&record["put_rate"], &record["max_connections"]),
            (&json!(0), &json!(4))
        );
        assert_eq!(user_of("ops", &record), Ok(ops));
        let bad = json!({"put_rate": -1});
        assert!(user_of("x", &bad).unwrap_err().contains("put_rate"));
        let bad = json!({"hash2": "xyz"});
        assert!(user_of("x", &bad).unwrap_err().contains("hash2"));
        let bad = json!({"tubes": {"jobs": ["read"]}});
        assert!(user_of("x", &bad).unwrap_err().contains("no right"));
    }
}
