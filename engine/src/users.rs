//! Users and their grants, as data: a name, the password's `sha1(sha1(password))` (what
//! chap-sha1 checks a scramble against, as Tarantool stores it), the cluster-wide `admin`
//! right, and per tube name the rights `put`, `take` and `admin`. The queue holds the table
//! so that it is journaled, snapshotted and replicated with everything else
//! ([`Event::UsersChanged`](crate::Event::UsersChanged) asks the journal to log it whole);
//! what a right allows, how a password is hashed and who may change the table are the
//! server's. Grants name tubes, not tube indexes: a grant may come before its tube (a
//! beanstalk `use` makes tubes on demand) and outlives a drop, as an operator would expect of
//! a name written in a config.

use std::collections::BTreeMap;

/// The longest user name: Tarantool allows more, but no deployment names users this long,
/// and the whole table travels in one WAL record.
pub const MAX_USER_NAME_BYTES: usize = 64;
/// The most users a server keeps (the bootstrap administrator and `guest` aside): the table
/// is logged whole on each change, so it stays small.
pub const MAX_USERS: usize = 1024;
/// The most tube grants one user holds.
pub const MAX_GRANTS_PER_USER: usize = 1024;
/// The tube name a grant on every tube is given under.
pub const EVERY_TUBE: &str = "*";
/// The length of a stored password hash (`sha1(sha1(password))`).
pub const HASH_LEN: usize = 20;

/// Rights on one tube, as bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rights(pub u8);

impl Rights {
    pub const NONE: Rights = Rights(0);
    /// Put tasks in.
    pub const PUT: Rights = Rights(1);
    /// Take tasks, and ack, release, touch and bury the ones one holds.
    pub const TAKE: Rights = Rights(2);
    /// Everything on the tube: create, drop, truncate, kick, pause, delete any task.
    pub const ADMIN: Rights = Rights(4);
    const ALL: u8 = 7;

    pub fn contains(self, other: Rights) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn union(self, other: Rights) -> Rights {
        Rights(self.0 | other.0)
    }
    pub fn without(self, other: Rights) -> Rights {
        Rights(self.0 & !other.0)
    }
    /// From stored bits; unknown bits are refused, never dropped silently.
    pub fn from_bits(bits: u8) -> Option<Rights> {
        (bits & !Self::ALL == 0).then_some(Rights(bits))
    }
    /// The right a name says (`put`, `take`, `admin`).
    pub fn named(name: &str) -> Option<Rights> {
        Some(match name {
            "put" => Rights::PUT,
            "take" => Rights::TAKE,
            "admin" => Rights::ADMIN,
            _ => return None,
        })
    }
    /// The names of the rights held, in a fixed order.
    pub fn names(self) -> Vec<&'static str> {
        [
            (Rights::PUT, "put"),
            (Rights::TAKE, "take"),
            (Rights::ADMIN, "admin"),
        ]
        .into_iter()
        .filter(|(r, _)| self.contains(*r))
        .map(|(_, n)| n)
        .collect()
    }
}

/// One user's own limits, over the server's defaults (`--user-max-connections`,
/// `--user-put-rate`): `None` takes the default, `Some(0)` lifts the limit for this user. The
/// server enforces them; the queue only keeps them with the user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserLimits {
    /// Connections the user may hold at once.
    pub max_connections: Option<u32>,
    /// Puts a second the user may make (after a second's worth at once).
    pub put_rate: Option<u32>,
}

/// One user.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// `sha1(sha1(password))`; `None`: the user cannot authenticate (as `guest`, who needs
    /// none).
    pub hash2: Option<[u8; HASH_LEN]>,
    /// Cluster-wide administration: users, every tube, placement and moves.
    pub admin: bool,
    /// Rights by tube name ([`EVERY_TUBE`] for every tube). No empty entry is kept.
    pub tubes: BTreeMap<String, Rights>,
    /// Its own connection and put limits, where they differ from the server's.
    pub limits: UserLimits,
}

impl User {
    pub fn new(name: &str) -> Self {
        User {
            name: name.to_owned(),
            ..User::default()
        }
    }

    /// The rights this user has on tube `tube`: its own grant and the every-tube one.
    pub fn rights_on(&self, tube: &str) -> Rights {
        if self.admin {
            return Rights(Rights::ALL);
        }
        let own = self.tubes.get(tube).copied().unwrap_or_default();
        let every = self.tubes.get(EVERY_TUBE).copied().unwrap_or_default();
        own.union(every)
    }

    /// Whether the user holds any right at all (for the connection limits: a `guest` with
    /// none may only authenticate).
    pub fn has_any_right(&self) -> bool {
        self.admin || !self.tubes.is_empty()
    }
}

/// The table of users, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Users {
    by_name: BTreeMap<String, User>,
    /// Users with a put rate of their own: while there are none, the server charges no put to
    /// a rate unless it has a default one (a function of `by_name`, so equality holds).
    with_put_rate: usize,
}

impl Users {
    pub fn get(&self, name: &str) -> Option<&User> {
        self.by_name.get(name)
    }
    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    /// Every user, by name.
    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.by_name.values()
    }
    /// Whether any user has a put rate of its own.
    pub fn any_put_rate(&self) -> bool {
        self.with_put_rate > 0
    }
    /// Adds or replaces `user`. The caller has checked the limits ([`check`]).
    pub(crate) fn put(&mut self, user: User) {
        self.with_put_rate += usize::from(user.limits.put_rate.is_some());
        if let Some(old) = self.by_name.insert(user.name.clone(), user) {
            self.with_put_rate -= usize::from(old.limits.put_rate.is_some());
        }
    }
    pub(crate) fn remove(&mut self, name: &str) -> Option<User> {
        let old = self.by_name.remove(name)?;
        self.with_put_rate -= usize::from(old.limits.put_rate.is_some());
        Some(old)
    }
    pub(crate) fn replace(&mut self, users: Vec<User>) {
        self.by_name = users.into_iter().map(|u| (u.name.clone(), u)).collect();
        self.with_put_rate = (self.by_name.values())
            .filter(|u| u.limits.put_rate.is_some())
            .count();
    }
}

/// Why a user cannot be stored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    #[error("user name '{0}' is not allowed: 1 to {MAX_USER_NAME_BYTES} printable characters")]
    BadName(String),
    #[error("too many users: at most {MAX_USERS}")]
    TooManyUsers,
    #[error("too many grants for user '{0}': at most {MAX_GRANTS_PER_USER}")]
    TooManyGrants(String),
    #[error("tube name '{0}' in a grant is not allowed: 1 to {max} bytes", max = crate::MAX_TUBE_NAME_BYTES)]
    BadTube(String),
}

/// Checks a user name: printable, no spaces at the ends, within [`MAX_USER_NAME_BYTES`].
pub fn check_name(name: &str) -> Result<(), UserError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_USER_NAME_BYTES
        && name.chars().all(|c| !c.is_control())
        && name.trim() == name;
    if ok {
        Ok(())
    } else {
        Err(UserError::BadName(name.to_owned()))
    }
}

/// Checks `user` before it joins `users` (replacing one of its name, if any).
pub fn check(users: &Users, user: &User) -> Result<(), UserError> {
    check_name(&user.name)?;
    if users.get(&user.name).is_none() && users.len() >= MAX_USERS {
        return Err(UserError::TooManyUsers);
    }
    if user.tubes.len() > MAX_GRANTS_PER_USER {
        return Err(UserError::TooManyGrants(user.name.clone()));
    }
    for t in user.tubes.keys() {
        if t.is_empty() || t.len() > crate::MAX_TUBE_NAME_BYTES {
            return Err(UserError::BadTube(t.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_on_a_tube_add_the_every_tube_grant_and_admin_has_all() {
        let mut u = User::new("bob");
        u.tubes.insert("jobs".into(), Rights::PUT);
        u.tubes.insert(EVERY_TUBE.into(), Rights::TAKE);
        assert_eq!(u.rights_on("jobs"), Rights::PUT.union(Rights::TAKE));
        assert_eq!(u.rights_on("other"), Rights::TAKE);
        u.admin = true;
        assert!(u.rights_on("other").contains(Rights::ADMIN));
    }

    #[test]
    fn the_table_knows_whether_anyone_has_a_put_rate() {
        let mut users = Users::default();
        let mut bob = User::new("bob");
        bob.limits.put_rate = Some(5);
        users.put(bob.clone());
        users.put(User::new("carl"));
        assert!(users.any_put_rate());
        bob.limits.put_rate = None;
        users.put(bob.clone());
        assert!(!users.any_put_rate(), "replaced without one");
        bob.limits.put_rate = Some(0);
        users.put(bob.clone());
        users.remove("bob");
        assert!(!users.any_put_rate(), "dropped");
        users.replace(vec![bob, User::new("carl")]);
        assert!(users.any_put_rate());
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("bob").is_ok());
        for bad in ["", " bob", "a\nb", &"x".repeat(MAX_USER_NAME_BYTES + 1)] {
            assert_eq!(check_name(bad), Err(UserError::BadName(bad.to_owned())));
        }
    }

    #[test]
    fn rights_round_trip_their_names_and_bits() {
        for n in ["put", "take", "admin"] {
            let r = Rights::named(n).unwrap();
            assert_eq!(r.names(), vec![n]);
            assert_eq!(Rights::from_bits(r.0), Some(r));
        }
        assert_eq!(Rights::from_bits(8), None);
        assert_eq!(Rights::named("read"), None);
    }
}
