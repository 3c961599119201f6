//! Users and grants managed over IPROTO in Tarantool's own terms: `box.schema.user.create`,
//! `passwd`, `drop`, `grant` and `revoke` as a net.box client calls them, and tarantool/queue's
//! `queue.tube.NAME:grant(user, {call = true})`. Each call is checked here against who asks,
//! worded and coded as Tarantool words its refusals, and becomes the core's `PutUser` or
//! `DropUser` (journaled, answered once durable). What the rights allow is
//! `core::access`'s.
//!
//! Object types: `universe` (any privilege: the cluster-wide `admin` right), the role `super`
//! (the same), and tarq's own `tube` with the privileges `put`, `take` and `admin` (a tube
//! name, or `*` for every tube). Tarantool has no `tube` object; its spaces and functions are
//! not tarq's.

use rmpv::Value;
use tarq_engine::users::{self, Rights, User, EVERY_TUBE};
use tarq_iproto::codes::*;
use tarq_iproto::{auth, response};

use super::{Iproto, Reply, Style};
use crate::core::access::{self, Grant, Need, Who, GUEST};
use crate::core::Command;
use crate::frontend::{Loop, ReplyTo};

/// The prefix of the management calls.
pub const PREFIX: &str = "box.schema.user.";
/// tarq's call listing every user and its grants (`tarq ctl user list`; an administrator's).
pub const LIST: &str = "tarq.users";
/// tarq's call setting a user's own limits (`tarq ctl user limit`; an administrator's).
pub const LIMITS: &str = "tarq.user_limits";

/// Tarantool's codes for what these calls refuse.
const ER_INVALID_IDENTIFIER: u32 = 70;
const ER_DROP_USER: u32 = 44;
const ER_USER_EXISTS: u32 = 46;
const ER_UNKNOWN_OBJECT_TYPE: u32 = 49;
const ER_NO_SUCH_ROLE: u32 = 82;
const ER_PRIV_GRANTED: u32 = 89;
const ER_PRIV_NOT_GRANTED: u32 = 91;
const ER_UNSUPPORTED_PRIV: u32 = 98;

type Refused = (u32, String);

/// A change a management call asks for: the user as it is to be, or one to drop, or nothing
/// (an `if_not_exists` that found it so).
enum Change {
    Put(User),
    Drop(String),
    None,
}

impl<L: Loop> Iproto<'_, L> {
    /// `box.schema.user.<op>(args)`.
    pub(super) fn user_call(
        &mut self,
        idx: usize,
        sync: u64,
        function: &str,
        op: &str,
        args: &[u8],
    ) {
        let change = self.user_change(idx, function, op, args);
        self.apply_user_change(idx, sync, change);
    }

    /// `queue.tube.<tube>:grant(user, {call = true, truncate = true})`: the original grants
    /// the functions of put, take, touch, ack, release, peek, bury, kick and delete with
    /// `call`, and truncate with `truncate`; tarq's `put` and `take` cover the first seven,
    /// and kick, delete and truncate are a tube's `admin` (which `truncate` gives).
    pub(super) fn tube_grant(&mut self, idx: usize, sync: u64, tube: &str, args: &[u8]) {
        let change = (|| {
            let a = values(args)?;
            let name = str_arg(&a, 0, "user name")?;
            let mut rights = Rights::NONE;
            if let Some(Value::Map(opts)) = a.get(1) {
                for (k, v) in opts {
                    let on = v.as_bool().unwrap_or(false);
                    match k.as_str() {
                        Some("call") if on => {
                            rights = rights.union(Rights::PUT.union(Rights::TAKE))
                        }
                        Some("truncate") if on => rights = rights.union(Rights::ADMIN),
                        _ => {}
                    }
                }
            }
            let mut user = self.existing(name)?;
            let had = user.tubes.get(tube).copied().unwrap_or_default();
            if had.union(rights) == had {
                return Ok(Change::None);
            }
            user.tubes.insert(tube.to_owned(), had.union(rights));
            Ok(Change::Put(user))
        })();
        self.apply_user_change(idx, sync, change);
    }

    /// `tarq.user_limits(name, {max_connections = N, put_rate = R})`: the user's own limits,
    /// over the server's `--user-max-connections` and `--user-put-rate`. Each is a whole number
    /// (0: no limit for this user) or `'default'` (the server's again); a key left out stays
    /// as it is. The bootstrap administrator has no limits to set.
    pub(super) fn user_limits(&mut self, idx: usize, sync: u64, args: &[u8]) {
        let change = (|| {
            let a = values(args)?;
            let mut user = self.existing(str_arg(&a, 0, "user name")?)?;
            let Some(Value::Map(given)) = a.get(1) else {
                return Err(bad("limits should be a map (argument 2)"));
            };
            let before = user.limits;
            let rate_max = crate::config::MAX_USER_PUT_RATE;
            for (k, v) in given {
                let (slot, max) = match k.as_str() {
                    Some("max_connections") => (&mut user.limits.max_connections, u32::MAX.into()),
                    Some("put_rate") => (&mut user.limits.put_rate, rate_max),
                    _ => {
                        return Err(bad(format!(
                            "unknown limit {k}: max_connections or put_rate"
                        )))
                    }
                };
                *slot = match v {
                    Value::String(s) if s.as_str() == Some("default") => None,
                    v => match v.as_u64().filter(|&n| n <= max) {
                        Some(n) => Some(n as u32),
                        None => {
                            let key = k.as_str().unwrap_or_default();
                            return Err(bad(format!(
                                "{key} {v} should be a whole number from 0 to {max}, or 'default'"
                            )));
                        }
                    },
                };
            }
            Ok(match user.limits == before {
                true => Change::None,
                false => Change::Put(user),
            })
        })();
        self.apply_user_change(idx, sync, change);
    }

    /// `tarq.users()`: every user with its grants, as a list of maps (`name`, `password`:
    /// whether one is set, `admin`, `tubes`: rights by tube, and its own `max_connections` and
    /// `put_rate` when it has them). The bootstrap administrator is not data and is not
    /// listed.
    pub(super) fn list_users(&mut self, idx: usize, sync: u64) {
        let users: Vec<Value> = (self.l.queue().users().iter())
            .map(|u| {
                let tubes = (u.tubes.iter())
                    .map(|(t, r)| (Value::from(t.as_str()), Value::from(r.names().join(","))))
                    .collect();
                let mut fields = vec![
                    (Value::from("name"), Value::from(u.name.as_str())),
                    (Value::from("password"), Value::from(u.hash2.is_some())),
                    (Value::from("admin"), Value::from(u.admin)),
                    (Value::from("tubes"), Value::Map(tubes)),
                ];
                let l = u.limits;
                for (key, own) in [
                    ("max_connections", l.max_connections),
                    ("put_rate", l.put_rate),
                ] {
                    if let Some(n) = own {
                        fields.push((Value::from(key), Value::from(n)));
                    }
                }
                Value::Map(fields)
            })
            .collect();
        let out = self.l.reply_buf(idx);
        let at = response::begin_data(out, sync, 1);
        rmpv::encode::write_value(out, &Value::Array(users)).expect("a Vec takes every byte");
        response::finish(out, at);
    }

    fn apply_user_change(&mut self, idx: usize, sync: u64, change: Result<Change, Refused>) {
        let r = Reply {
            sync,
            call16: false,
            style: Style::Silent,
            tube: 0,
            first: 0,
        };
        match change {
            Ok(Change::Put(user)) => {
                self.l
                    .dispatch(idx, ReplyTo::Iproto(r), Command::PutUser { user: &user });
            }
            Ok(Change::Drop(name)) => {
                self.l
                    .dispatch(idx, ReplyTo::Iproto(r), Command::DropUser { name: &name });
            }
            Ok(Change::None) => response::empty_data(self.l.reply_buf(idx), sync),
            Err((code, msg)) => response::error(self.l.reply_buf(idx), sync, code, &msg),
        }
    }

    /// The change `box.schema.user.OP` asks for, checked: who may ask it (an administrator;
    /// anyone for their own password) and against the users there are.
    fn user_change(
        &self,
        idx: usize,
        function: &str,
        op: &str,
        args: &[u8],
    ) -> Result<Change, Refused> {
        let a = values(args)?;
        let who = self.l.who(idx);
        let admin = who.allows(self.l.queue().users(), Need::Admin);
        let denied = (
            ER_ACCESS_DENIED,
            format!(
                "Execute access to function '{function}' is denied for user '{}'",
                who.name()
            ),
        );
        match op {
            "create" | "drop" | "grant" | "revoke" if !admin => Err(denied),
            "create" => self.create_user(&a),
            "passwd" => self.passwd(&a, who, admin, denied),
            "drop" => self.drop_user(&a),
            "grant" | "revoke" => self.grant_or_revoke(&a, op == "grant"),
            _ => Err((
                ER_NO_SUCH_PROC,
                format!("Procedure '{function}' is not defined"),
            )),
        }
    }

    /// `create(name[, {password, if_not_exists}])`.
    fn create_user(&self, a: &[Value]) -> Result<Change, Refused> {
        let name = str_arg(a, 0, "user name")?;
        let opts = a.get(1);
        if self.is_system(name) || self.l.queue().users().get(name).is_some() {
            return if opt_bool(opts, "if_not_exists") {
                Ok(Change::None)
            } else {
                Err((ER_USER_EXISTS, format!("User '{name}' already exists")))
            };
        }
        users::check_name(name).map_err(|_| {
            (
                ER_INVALID_IDENTIFIER,
                format!("Invalid identifier '{name}' (expected printable symbols only or it is too long)"),
            )
        })?;
        let mut user = User::new(name);
        if let Some(p) = opt_str(opts, "password")? {
            user.hash2 = Some(auth::hash2(p));
        }
        Ok(Change::Put(user))
    }

    /// `passwd(password)` of the caller's own, as Tarantool allows anyone, or an
    /// administrator's `passwd(name, password)`.
    fn passwd(
        &self,
        a: &[Value],
        who: &Who,
        admin: bool,
        denied: Refused,
    ) -> Result<Change, Refused> {
        let (name, password) = match a.len() {
            1 => match who {
                Who::User(n) if &**n != GUEST => (n.to_string(), str_arg(a, 0, "password")?),
                _ => return Err(denied),
            },
            _ if admin => (
                str_arg(a, 0, "user name")?.to_owned(),
                str_arg(a, 1, "password")?,
            ),
            _ => return Err(denied),
        };
        if self.is_system(&name) {
            return Err((
                ER_ILLEGAL_PARAMS,
                format!(
                    "Illegal parameters, the password of '{name}' is set in tarq's configuration"
                ),
            ));
        }
        let mut user = self.stored(&name)?;
        user.hash2 = Some(auth::hash2(password));
        Ok(Change::Put(user))
    }

    /// `drop(name[, {if_exists}])`.
    fn drop_user(&self, a: &[Value]) -> Result<Change, Refused> {
        let name = str_arg(a, 0, "user name")?;
        if self.is_system(name) {
            return Err((
                ER_DROP_USER,
                format!("Failed to drop user or role '{name}': the user or the role is a system"),
            ));
        }
        match self.l.queue().users().get(name) {
            Some(_) => Ok(Change::Drop(name.to_owned())),
            None if opt_bool(a.get(1), "if_exists") => Ok(Change::None),
            None => Err(no_such_user(name)),
        }
    }

    /// `grant(name, privileges, object type, object[, {if_not_exists}])` and `revoke(...,
    /// {if_exists})`: refused as Tarantool refuses a grant held already or a revoke of what is
    /// not held, unless the option says to let it be.
    fn grant_or_revoke(&self, a: &[Value], grant: bool) -> Result<Change, Refused> {
        let name = str_arg(a, 0, "user name")?;
        let (object, opts) = object(a)?;
        let mut user = self.existing(name)?;
        let quiet = if grant {
            opt_bool(opts, "if_not_exists")
        } else {
            opt_bool(opts, "if_exists")
        };
        let text = match &object {
            Grant::Admin => "execute access on universe".to_owned(),
            Grant::Tube(tube, rights) => {
                format!("{} access on tube '{tube}'", rights.names().join(","))
            }
        };
        // Nothing to change: all of it held already (grant), or none of it (revoke).
        if access::apply(&mut user, &object, grant) {
            return Ok(Change::Put(user));
        }
        match (quiet, grant) {
            (true, _) => Ok(Change::None),
            (false, true) => Err((ER_PRIV_GRANTED, format!("User '{name}' already has {text}"))),
            (false, false) => Err((
                ER_PRIV_NOT_GRANTED,
                format!("User '{name}' does not have {text}"),
            )),
        }
    }

    /// `guest` and the bootstrap administrator (the config's `--user`, which is not data):
    /// neither can be created, dropped or given a password here.
    fn is_system(&self, name: &str) -> bool {
        name == GUEST || self.is_bootstrap(name)
    }

    fn is_bootstrap(&self, name: &str) -> bool {
        let boot = self.l.config().auth.as_ref();
        boot.is_some_and(|c| c.user == name)
    }

    /// A stored user (not `guest`, who has no password to change).
    fn stored(&self, name: &str) -> Result<User, Refused> {
        match self.l.queue().users().get(name) {
            Some(u) if name != GUEST => Ok(u.clone()),
            _ => Err(no_such_user(name)),
        }
    }

    /// A user to grant to: a stored one, or `guest` (kept as data once granted something).
    fn existing(&self, name: &str) -> Result<User, Refused> {
        if self.is_bootstrap(name) {
            return Err((
                ER_ILLEGAL_PARAMS,
                format!("Illegal parameters, '{name}' is the bootstrap administrator and has every right"),
            ));
        }
        match self.l.queue().users().get(name) {
            Some(u) => Ok(u.clone()),
            None if name == GUEST => Ok(User::new(GUEST)),
            None => Err(no_such_user(name)),
        }
    }
}

fn no_such_user(name: &str) -> Refused {
    (ER_NO_SUCH_USER, format!("User '{name}' is not found"))
}

fn bad(what: impl Into<String>) -> Refused {
    (
        ER_ILLEGAL_PARAMS,
        format!("Illegal parameters, {}", what.into()),
    )
}

/// The call's arguments as values (a management call is rare: no need to decode in place).
fn values(args: &[u8]) -> Result<Vec<Value>, Refused> {
    match rmpv::decode::read_value(&mut &args[..]) {
        Ok(Value::Array(a)) => Ok(a),
        _ => Err(bad("the arguments are not an array")),
    }
}

fn str_arg<'v>(a: &'v [Value], i: usize, what: &str) -> Result<&'v str, Refused> {
    a.get(i)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{what} should be a string (argument {})", i + 1)))
}

fn opt<'v>(opts: Option<&'v Value>, key: &str) -> Option<&'v Value> {
    match opts? {
        Value::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn opt_bool(opts: Option<&Value>, key: &str) -> bool {
    opt(opts, key).and_then(Value::as_bool).unwrap_or(false)
}

fn opt_str<'v>(opts: Option<&'v Value>, key: &str) -> Result<Option<&'v str>, Refused> {
    match opt(opts, key) {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| {
            bad(format!(
                "options parameter '{key}' should be of type string"
            ))
        }),
    }
}

/// The object of `grant(user, privileges, type, name, opts)` or `grant(user, role, nil, nil,
/// opts)`, and the options.
fn object(a: &[Value]) -> Result<(Grant, Option<&Value>), Refused> {
    let privs = str_arg(a, 1, "privileges")?;
    let kind = a.get(2).and_then(Value::as_str);
    let target = a.get(3).and_then(Value::as_str);
    let opts = a.get(4).or_else(|| a.get(2).filter(|v| v.is_map()));
    match kind {
        // The two-argument form names a role.
        None | Some("role") => {
            let role = if kind.is_some() {
                target.unwrap_or("")
            } else {
                privs
            };
            if role == "super" {
                Ok((Grant::Admin, opts))
            } else {
                Err((ER_NO_SUCH_ROLE, format!("Role '{role}' is not found")))
            }
        }
        Some("universe") => {
            for p in privs.split(',').map(str::trim) {
                if ![
                    "read", "write", "execute", "session", "usage", "create", "drop", "alter",
                ]
                .contains(&p)
                {
                    return Err((
                        ER_UNSUPPORTED_PRIV,
                        format!("Unsupported universe privilege '{p}'"),
                    ));
                }
            }
            Ok((Grant::Admin, opts))
        }
        Some("tube") => {
            let tube = target.ok_or_else(|| bad("a tube grant names the tube (or '*')"))?;
            if tube.is_empty() || tube.len() > tarq_engine::MAX_TUBE_NAME_BYTES {
                return Err(bad(format!("tube name '{tube}' in a grant")));
            }
            let mut rights = Rights::NONE;
            for p in privs.split(',').map(str::trim) {
                let r = Rights::named(p).ok_or_else(|| {
                    (
                        ER_UNSUPPORTED_PRIV,
                        format!("Unsupported tube privilege '{p}'"),
                    )
                })?;
                rights = rights.union(r);
            }
            let _ = EVERY_TUBE;
            Ok((Grant::Tube(tube.to_owned(), rights), opts))
        }
        Some(other) => Err((
            ER_UNKNOWN_OBJECT_TYPE,
            format!("Unknown object type '{other}'"),
        )),
    }
}
