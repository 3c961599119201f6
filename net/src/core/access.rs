//! Who a connection acts as and what that lets it do: the one place the users and grants the
//! queue keeps (`tarq_engine::users`) are read against a request. Front-ends ask it before they
//! dispatch and word its answer in their protocol (IPROTO: Tarantool's `Execute access to
//! function ... is denied`; beanstalk: a tube that is not there); what a right means is decided
//! here, once for every protocol.
//!
//! With no `--user` configured the server is open, as it always was: every connection acts as
//! [`Who::Everyone`] and nothing is checked, whatever users the data directory holds. With
//! `--user`, that user is the bootstrap administrator (its password is the config's, it is
//! never stored and cannot be dropped), a connection starts as `guest`, and `guest` holds only
//! what it was granted.

use tarq_engine::users::{Rights, User, Users};

/// The name of the user a connection is before it authenticates.
pub const GUEST: &str = "guest";

/// Who a connection acts as.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Who {
    /// No check: an open server (no `--user`), the bootstrap administrator, a node of the
    /// cluster (links and replicas log in as the bootstrap administrator), or a beanstalk port
    /// without `--beanstalk-user`.
    #[default]
    Everyone,
    /// `guest` or a stored user, by name: looked up at each check, so a grant, a revoke or a
    /// drop applies to connections already open.
    User(Box<str>),
}

impl Who {
    pub fn guest() -> Who {
        Who::User(GUEST.into())
    }

    /// The name to show in a refusal.
    pub fn name(&self) -> &str {
        match self {
            Who::Everyone => "admin",
            Who::User(n) => n,
        }
    }

    fn user<'u>(&self, users: &'u Users) -> Option<&'u User> {
        match self {
            Who::Everyone => None,
            Who::User(n) => users.get(n),
        }
    }

    /// The rights on tube `tube` (all of them for [`Who::Everyone`]).
    pub fn rights_on(&self, users: &Users, tube: &str) -> Rights {
        match self {
            Who::Everyone => Rights::PUT.union(Rights::TAKE).union(Rights::ADMIN),
            _ => self.user(users).map_or(Rights::NONE, |u| u.rights_on(tube)),
        }
    }

    /// Whether `need` is met.
    pub fn allows(&self, users: &Users, need: Need<'_>) -> bool {
        if *self == Who::Everyone {
            return true;
        }
        let user = self.user(users);
        match need {
            Need::Nothing => true,
            Need::Tube(tube, rights) => self.rights_on(users, tube).contains(rights),
            Need::AnyOn(tube) => !self.rights_on(users, tube).is_empty(),
            Need::Tasks(tube) => {
                let r = self.rights_on(users, tube);
                r.contains(Rights::TAKE) || r.contains(Rights::ADMIN)
            }
            Need::Any => user.is_some_and(User::has_any_right),
            Need::Admin => user.is_some_and(|u| u.admin),
        }
    }

    /// Whether the connection may call anything at all (for the connection limits: one that
    /// may not is closed if it does not authenticate in time).
    pub fn may_call(&self, users: &Users) -> bool {
        self.allows(users, Need::Any)
    }
}

/// Who `user` with `password` is, checked as HTTP Basic sends them (in the clear, inside TLS):
/// the bootstrap administrator (`bootstrap`, the configured `--user` and `--password`) or a
/// stored user whose `sha1(sha1(password))` is the one kept. `None`: unknown user, no password
/// set, or the wrong one. Both comparisons take the same time however much of a guess is right.
pub fn login(users: &Users, bootstrap: (&str, &str), user: &str, password: &str) -> Option<Who> {
    if user == bootstrap.0 {
        return constant_time_eq(password.as_bytes(), bootstrap.1.as_bytes())
            .then_some(Who::Everyone);
    }
    let kept = users.get(user)?.hash2?;
    let given = tarq_iproto::auth::hash2(password);
    constant_time_eq(&given, &kept).then(|| Who::User(user.into()))
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A connection refused at its user's connection limit (`--user-max-connections`, or the
/// user's own `max_connections`, `own`); the loop counts, the front-end words it for its
/// client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Too many connections for user '{user}': the limit is {limit} ({})",
    if *own { "its max_connections" } else { "--user-max-connections" }
)]
pub struct UserRefused {
    pub user: Box<str>,
    pub limit: usize,
    pub own: bool,
}

/// What a grant or revoke names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The cluster's `admin` right.
    Admin,
    /// These rights on this tube (`*`: every tube).
    Tube(String, Rights),
}

/// Grants (`grant`) or revokes `what` on `user`; false when that changes nothing (all of it
/// held already, or none of it). A tube left with no right loses its entry.
pub fn apply(user: &mut User, what: &Grant, grant: bool) -> bool {
    match what {
        Grant::Admin => std::mem::replace(&mut user.admin, grant) != grant,
        Grant::Tube(tube, rights) => {
            let had = user.tubes.get(tube).copied().unwrap_or_default();
            let now = if grant {
                had.union(*rights)
            } else {
                had.without(*rights)
            };
            if now.is_empty() {
                user.tubes.remove(tube);
            } else {
                user.tubes.insert(tube.clone(), now);
            }
            now != had
        }
    }
}

/// What a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need<'a> {
    /// Any connection may (ping, the protocol's own requests).
    Nothing,
    /// These rights on this tube.
    Tube(&'a str, Rights),
    /// Some right on this tube (its figures).
    AnyOn(&'a str),
    /// Seeing this tube's tasks and their data (the console's task lists): `take` or `admin`
    /// on it — a producer with `put` alone sees the figures, not what others put.
    Tasks(&'a str),
    /// Some right somewhere (the server's figures, sessions).
    Any,
    /// The cluster-wide `admin` right: users, server settings, placement and moves.
    Admin,
}

/// What a call of the tube API's method `method` on a tube needs (`queue.tube.NAME:METHOD`).
/// `bury` needs `take` here; a caller without `admin` may bury only a task it holds, which the
/// front-end checks against the task.
pub fn method_needs<'a>(tube: &'a str, method: &str) -> Need<'a> {
    let rights = match method {
        "put" | "put_many" => Rights::PUT,
        "take" | "take_many" | "ack" | "ack_many" | "release" | "touch" | "peek" | "bury" => {
            Rights::TAKE
        }
        "kick" | "delete" | "drop" | "truncate" | "release_all" | "grant" => Rights::ADMIN,
        // Not a method: answered as such, to whoever may see the tube.
        _ => return Need::AnyOn(tube),
    };
    Need::Tube(tube, rights)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tarq_engine::Queue;

    fn users() -> Users {
        let mut q = Queue::new();
        let mut bob = User::new("bob");
        bob.tubes.insert("jobs".into(), Rights::PUT);
        q.put_user(bob).unwrap();
        let mut ops = User::new("ops");
        ops.admin = true;
        q.put_user(ops).unwrap();
        let mut watcher = User::new("watcher");
        watcher.tubes.insert("jobs".into(), Rights::ADMIN);
        q.put_user(watcher).unwrap();
        q.users().clone()
    }

    #[test]
    fn each_need_against_each_kind_of_user() {
        let u = users();
        let bob = Who::User("bob".into());
        let ops = Who::User("ops".into());
        let guest = Who::guest();
        let gone = Who::User("gone".into());
        let put = Need::Tube("jobs", Rights::PUT);
        let take = Need::Tube("jobs", Rights::TAKE);
        for (who, need, want) in [
            (&bob, put, true),
            (&bob, take, false),
            (&bob, Need::Tube("other", Rights::PUT), false),
            (&bob, Need::AnyOn("jobs"), true),
            (&bob, Need::AnyOn("other"), false),
            (&bob, Need::Tasks("jobs"), false),
            (&ops, Need::Tasks("jobs"), true),
            (&bob, Need::Any, true),
            (&bob, Need::Admin, false),
            (&ops, take, true),
            (&ops, Need::Admin, true),
            (&guest, Need::Any, false),
            (&guest, Need::Nothing, true),
            (&Who::User("watcher".into()), Need::Tasks("jobs"), true),
            (&Who::User("watcher".into()), Need::Tasks("other"), false),
            (&gone, put, false),
            (&Who::Everyone, Need::Admin, true),
        ] {
            assert_eq!(who.allows(&u, need), want, "{who:?} {need:?}");
        }
    }

    #[test]
    fn a_login_is_the_bootstrap_administrator_or_a_stored_user_with_its_password() {
        let mut q = Queue::new();
        let mut bob = User::new("bob");
        bob.hash2 = Some(tarq_iproto::auth::hash2("s3cret"));
        q.put_user(bob).unwrap();
        q.put_user(User::new("nopass")).unwrap();
        let u = q.users().clone();
        let admin = ("root", "toor");
        assert_eq!(login(&u, admin, "root", "toor"), Some(Who::Everyone));
        assert_eq!(login(&u, admin, "root", "s3cret"), None);
        assert_eq!(
            login(&u, admin, "bob", "s3cret"),
            Some(Who::User("bob".into()))
        );
        assert_eq!(login(&u, admin, "bob", "s3cre"), None);
        assert_eq!(login(&u, admin, "nopass", ""), None);
        assert_eq!(login(&u, admin, "nobody", ""), None);
        assert_eq!(login(&u, admin, GUEST, ""), None);
    }

    #[test]
    fn methods_need_the_right_of_their_kind() {
        assert_eq!(method_needs("t", "put"), Need::Tube("t", Rights::PUT));
        assert_eq!(method_needs("t", "bury"), Need::Tube("t", Rights::TAKE));
        assert_eq!(method_needs("t", "drop"), Need::Tube("t", Rights::ADMIN));
        assert_eq!(method_needs("t", "nope"), Need::AnyOn("t"));
    }
}
