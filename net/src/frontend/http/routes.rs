//! The routes: one request, checked (credentials, read-only without them, the origin of an
//! action) and answered — a read from the queue as it is now, an action as the core's
//! command. The table is [`Request::serve`]; `/api/openapi.json` describes it.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::core::access::{self, Need, Who, GUEST};
use tarq_engine::{Micros, Rights, Status, TubeIx, TubeOptions, TubePut, TubeType, DEFAULT_TUBE};

use super::json::{self, Answer};
use super::response::{self, error_response, Head};
use super::{
    assets, Reply, TubeTotals, DEFAULT_PAGE, MAX_EVENT_STREAMS, MAX_PAGE, PROMETHEUS_TEXT,
};
use crate::core::{Command, Pause};
use crate::frontend::{Loop, ReplyTo, Then};
use std::collections::HashMap;

const SECOND: f64 = 1e6;

/// Longest pause asked through the API: beanstalk's own limit (a `u32` of seconds) would be a
/// century; a day is longer than any operator means, and a longer one is refused by name.
const MAX_PAUSE_SECONDS: u32 = 86_400;

/// One request being answered.
pub struct Request<'r, L: Loop> {
    l: &'r mut L,
    idx: usize,
    head: &'r Head<'r>,
    body: &'r [u8],
    /// Who the request acts as, once its credentials are checked.
    who: Who,
    /// The connection closes once this request is answered, for this reason.
    close: Option<&'static str>,
}

/// A refusal: status, reason.
type Refused = (u16, String);

fn refused<T>(status: u16, why: impl Into<String>) -> Result<T, Refused> {
    Err((status, why.into()))
}

impl<'r, L: Loop> Request<'r, L> {
    pub fn new(l: &'r mut L, idx: usize, head: &'r Head<'r>, body: &'r [u8]) -> Self {
        Request {
            l,
            idx,
            head,
            body,
            who: Who::Everyone,
            close: None,
        }
    }

    pub fn serve(mut self) -> Then<'static> {
        if let Err((status, why)) = self.route() {
            self.l.http().errors += 1;
            let auth = [(
                "WWW-Authenticate",
                "Basic realm=\"tarq\", charset=\"UTF-8\"",
            )];
            let headers: &[(&str, &str)] = if status == 401 { &auth } else { &[] };
            let out = self.l.reply_buf(self.idx);
            error_response(out, status, &why, self.head.close, headers);
        }
        match self.close {
            Some(reason) => Then::Close(reason),
            None => Then::Done,
        }
    }

    fn route(&mut self) -> Result<(), Refused> {
        // Split first, then decode each segment: a tube named `a b/c` is `a%20b%2Fc` in a
        // path, one segment, as the console's `encodeURIComponent` writes it.
        let segments = (self.head.path.split('/').skip(1))
            .map(|p| decode_path(p, self.head.path))
            .collect::<Result<Vec<String>, Refused>>()?;
        let parts: Vec<&str> = segments.iter().map(String::as_str).collect();
        let method = self.head.method;
        if let Some(why) = self.l.http().hosts.refusal(self.head.host) {
            return refused(403, why);
        }
        if parts == ["metrics"] {
            if self.l.config().metrics_auth {
                self.who = self.check_credentials()?;
                self.allow(Need::Any, "the metrics")?;
            }
            return self.metrics(method);
        }
        self.who = self.check_credentials()?;
        match (method, parts.as_slice()) {
            ("GET", [""]) | ("GET", ["index.html"]) => self.asset("index.html"),
            ("GET", ["assets", name]) => self.asset(name),
            ("GET", ["api", "openapi.json"]) => {
                self.send(200, "application/json", assets::OPENAPI.as_bytes());
                Ok(())
            }
            ("GET", ["api", "tubes"]) => self.list_tubes(),
            ("POST", ["api", "tubes"]) => self.create_tube(),
            ("GET", ["api", "tubes", name]) => self.one_tube(name),
            ("GET", ["api", "tubes", name, "tasks"]) => self.list_tasks(name),
            ("POST", ["api", "tubes", name, "tasks"]) => self.put(name),
            ("GET", ["api", "tubes", name, "tasks", id]) => self.peek(name, id),
            ("POST", ["api", "tubes", name, "tasks", id, action]) => {
                self.task_action(name, id, action)
            }
            ("POST", ["api", "tubes", name, action]) => self.tube_action(name, action),
            ("GET", ["api", "server"]) => self.server(),
            ("GET", ["api", "cluster"]) => self.cluster(),
            ("GET", ["api", "users"]) => self.users(),
            ("POST", ["api", "users"]) => self.create_user(),
            ("POST", ["api", "users", name, action]) => self.user_action(name, action),
            ("GET", ["api", "history"]) => self.history(None),
            ("GET", ["api", "tubes", name, "history"]) => self.history(Some(name)),
            ("GET", ["api", "events"]) => self.events(),
            (_, ["api", ..]) | (_, [""]) => refused(
                if known_path(&parts) { 405 } else { 404 },
                format!("no route {method} {}", self.head.path),
            ),
            _ => refused(404, format!("no page {}", self.head.path)),
        }
    }

    // ---- checks ----

    /// Who the request acts as. With `--user`/`--password`: HTTP Basic as that bootstrap
    /// administrator or as a stored user with a password (`access::login`); without, anyone
    /// may read ([`Who::Everyone`], and [`Self::check_action`] refuses every action).
    fn check_credentials(&self) -> Result<Who, Refused> {
        let Some(creds) = &self.l.config().auth else {
            return Ok(Who::Everyone);
        };
        let given = self
            .head
            .authorization
            .and_then(|v| v.strip_prefix(b"Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim_ascii())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok());
        let Some(given) = given else {
            return refused(
                401,
                "this tarq asks for a user and password (HTTP Basic): its --user, or a user \
                 with a password",
            );
        };
        let (user, password) = given.split_once(':').unwrap_or((&given, ""));
        let bootstrap = (creds.user.as_str(), creds.password.as_str());
        access::login(self.l.queue().users(), bootstrap, user, password)
            .ok_or((401, "wrong user or password".to_owned()))
    }

    /// Refuses (403) what the request's user may not do, naming the right it needs.
    fn allow(&self, need: Need<'_>, what: &str) -> Result<(), Refused> {
        if self.who.allows(self.l.queue().users(), need) {
            return Ok(());
        }
        let needs = match need {
            Need::Tube(tube, rights) => {
                format!(
                    "the {} right on tube '{tube}'",
                    rights.names().join(" and ")
                )
            }
            Need::AnyOn(tube) => format!("a right on tube '{tube}'"),
            Need::Tasks(tube) => format!("the take or admin right on tube '{tube}'"),
            Need::Any => "a right on some tube".to_owned(),
            Need::Admin | Need::Nothing => "the cluster's admin right".to_owned(),
        };
        refused(
            403,
            format!(
                "access to {what} is denied for user '{}': it needs {needs}",
                self.who.name()
            ),
        )
    }

    /// An action that needs `need`: refused without credentials configured (the console is
    /// read-only then), from a foreign origin (a page elsewhere posting with the browser's
    /// credentials), and to a user without the right.
    fn check_action(&self, need: Need<'_>, what: &str) -> Result<(), Refused> {
        if self.l.config().auth.is_none() {
            return refused(
                403,
                "the console is read-only: actions need tarq started with --user and --password",
            );
        }
        if let Some(origin) = self.head.origin {
            let own = self.head.host.map(|h| [b"http://", h].concat());
            let https = self.head.host.map(|h| [b"https://", h].concat());
            let same = own.as_deref() == Some(origin) || https.as_deref() == Some(origin);
            if !same {
                return refused(
                    403,
                    format!(
                        "an action from origin {} is refused: only the console's own origin may act",
                        String::from_utf8_lossy(origin)
                    ),
                );
            }
        }
        self.allow(need, what)
    }

    // ---- writing ----

    fn send(&mut self, status: u16, content_type: &str, body: &[u8]) {
        let close = self.head.close;
        let out = self.l.reply_buf(self.idx);
        response::write(out, status, content_type, body, close, &[]);
    }

    fn send_json(&mut self, status: u16, v: &Value) {
        self.send(status, "application/json", v.to_string().as_bytes());
    }

    fn reply(&self, answer: Answer, tube: TubeIx, first: u64) -> ReplyTo {
        ReplyTo::Http(Reply {
            answer,
            close: self.head.close,
            tube,
            first,
        })
    }

    // ---- pages and figures ----

    fn metrics(&mut self, method: &str) -> Result<(), Refused> {
        if method != "GET" {
            return refused(405, "GET /metrics");
        }
        let mut page = String::new();
        self.l.metrics_page(&mut page);
        // One scrape, one connection, as the port always answered it: a scraper that reads
        // to the close (and every one that reads the length) is served alike.
        let out = self.l.reply_buf(self.idx);
        response::write(out, 200, PROMETHEUS_TEXT, page.as_bytes(), true, &[]);
        self.close = Some("metrics scraped");
        Ok(())
    }

    fn asset(&mut self, name: &str) -> Result<(), Refused> {
        let Some((content_type, body)) = assets::get(name) else {
            return refused(404, format!("no page {}", self.head.path));
        };
        self.send(200, content_type, body);
        Ok(())
    }

    fn history(&mut self, tube: Option<&str>) -> Result<(), Refused> {
        match tube {
            Some(name) => self.seen_tube(name).map(|_| ())?,
            None => self.allow(Need::Any, "the server's figures")?,
        }
        let mut out = String::new();
        self.l.live().history_json(&mut out, tube);
        self.send(200, "application/json", out.as_bytes());
        Ok(())
    }

    fn events(&mut self) -> Result<(), Refused> {
        self.allow(Need::Any, "the server's figures")?;
        if let Err(open) = self.l.start_stream(self.idx) {
            return refused(
                503,
                format!("{open} event streams are open, the limit ({MAX_EVENT_STREAMS})"),
            );
        }
        let out = self.l.reply_buf(self.idx);
        response::event_stream_head(out);
        // The newest second at once, so a page has figures before the next tick.
        let mut first = String::new();
        self.l.live().event_json(&mut first);
        super::event(self.l.reply_buf(self.idx), &first);
        Ok(())
    }

    fn server(&mut self) -> Result<(), Refused> {
        self.allow(Need::Any, "the server's figures")?;
        let snap = self.l.snapshot();
        let mut figures = serde_json::Map::new();
        for m in snap.metrics() {
            figures.insert(m.name.to_owned(), json!(m.value));
        }
        let [iproto, beanstalk, http] = self.l.addresses();
        let cfg = self.l.config();
        let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string());
        let wal_mode = cfg.wal.mode.to_string();
        // Who the console is logged in as, for it to offer only what that user may do.
        let users = self.l.queue().users();
        let every_tube = self.who.rights_on(users, tarq_engine::users::EVERY_TUBE);
        let name = match (&self.who, &cfg.auth) {
            (Who::User(name), _) => Some(&**name),
            (Who::Everyone, auth) => auth.as_ref().map(|c| c.user.as_str()),
        };
        let you = json!({
            "user": name,
            "admin": self.who.allows(users, Need::Admin),
            "every_tube": every_tube.names(),
        });
        let v = json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime": snap.uptime as f64 / SECOND,
            "connections": self.l.connection_counts(),
            "http": self.l.console_figures(),
            "listen": {
                "iproto": addr(iproto),
                "beanstalk": addr(beanstalk),
                "http": addr(http),
            },
            "wal": {
                "mode": wal_mode,
                "dir": cfg.data_dir.display().to_string(),
                "snapshot_every_bytes": cfg.wal.snapshot_every_bytes,
                "keep_snapshots": cfg.wal.keep_snapshots,
            },
            "limits": {
                "max_connections": cfg.max_connections,
                "max_connections_per_address": cfg.limits.max_connections_per_peer,
                "max_frame_bytes": cfg.max_frame_bytes,
                "max_write_backlog": cfg.max_write_backlog,
                "max_tasks": cfg.max_tasks,
                "input_budget": cfg.limits.input_budget,
            },
            "auth": cfg.auth.is_some(),
            "you": you,
            "read_only": cfg.auth.is_none(),
            "figures": figures,
        });
        self.send_json(200, &v);
        Ok(())
    }

    /// `queue.cluster()`'s picture; on a sharded cluster with this node's `links` to the other
    /// sets and every set's `moves_in_cluster` (its primary's, at most a second or two old).
    fn cluster(&mut self) -> Result<(), Refused> {
        self.allow(Need::Any, "the cluster's figures")?;
        let mut v = crate::ctl::to_json(&self.l.cluster_overview());
        if let Some(p) = self.l.cluster_picture() {
            v["links"] = p["links"].clone();
            v["moves_in_cluster"] = p["moves"].clone();
        }
        self.send_json(200, &v);
        Ok(())
    }

    /// Every stored user with its grants (no password hash: whether one is set), as
    /// `tarq.users()` answers an administrator over IPROTO. Behind the same HTTP Basic as every
    /// route: with `--user`, the bootstrap administrator's.
    fn users(&mut self) -> Result<(), Refused> {
        self.allow(Need::Admin, "the users")?;
        let users: Vec<Value> = (self.l.queue().users().iter())
            .map(|u| {
                let tubes: serde_json::Map<String, Value> = (u.tubes.iter())
                    .map(|(t, r)| (t.clone(), Value::from(r.names())))
                    .collect();
                let mut v = serde_json::json!({
                    "name": u.name,
                    "password": u.hash2.is_some(),
                    "admin": u.admin,
                    "tubes": tubes,
                });
                // Its own limits, where it has them (else the server's apply).
                if let Some(n) = u.limits.max_connections {
                    v["max_connections"] = n.into();
                }
                if let Some(r) = u.limits.put_rate {
                    v["put_rate"] = r.into();
                }
                v
            })
            .collect();
        self.send_json(200, &serde_json::json!({ "users": users }));
        Ok(())
    }

    /// `POST /api/users` `{"name", "password"}`: a new user with no right (201).
    fn create_user(&mut self) -> Result<(), Refused> {
        self.check_action(Need::Admin, "a user's creation")?;
        let b = self.body()?;
        only_keys(&b, "a user's creation", &["name", "password"])?;
        let name = b["name"]
            .as_str()
            .ok_or((400, "name: a string is required".to_owned()))?;
        if self.is_system_user(name) || self.l.queue().users().get(name).is_some() {
            return refused(409, format!("User '{name}' already exists"));
        }
        tarq_engine::users::check_name(name).map_err(|e| (400, e.to_string()))?;
        let mut user = tarq_engine::User::new(name);
        if let Some(p) = b.get("password") {
            let p = p.as_str().ok_or((400, "password: a string".to_owned()))?;
            user.hash2 = Some(tarq_iproto::auth::hash2(p));
        }
        let reply = self.reply(Answer::Created, DEFAULT_TUBE, 0);
        self.l
            .dispatch(self.idx, reply, Command::PutUser { user: &user });
        Ok(())
    }

    /// `POST /api/users/NAME/ACTION`: `password` `{"password"}`, `grant` and `revoke`
    /// `{"tube", "rights": [...]}` or `{"cluster": true}`, `limits` `{"max_connections",
    /// "put_rate"}`, `drop`.
    fn user_action(&mut self, name: &str, action: &str) -> Result<(), Refused> {
        if !matches!(action, "password" | "grant" | "revoke" | "limits" | "drop") {
            return refused(
                404,
                format!("no action {action}: password, grant, revoke, limits, drop"),
            );
        }
        self.check_action(Need::Admin, &format!("{action} of user '{name}'"))?;
        let b = self.body()?;
        if self.is_system_user(name) && !(name == GUEST && action != "password") {
            return refused(
                409,
                format!("'{name}' is a system user: its {action} is not the API's to change"),
            );
        }
        let mut user = match self.l.queue().users().get(name) {
            Some(u) => u.clone(),
            None if name == GUEST => tarq_engine::User::new(GUEST),
            None => return refused(404, format!("User '{name}' is not found")),
        };
        let reply = self.reply(Answer::Ok, DEFAULT_TUBE, 0);
        match action {
            "drop" => {
                only_keys(&b, "a drop", &[])?;
                let cmd = Command::DropUser { name };
                self.l.dispatch(self.idx, reply, cmd);
                return Ok(());
            }
            "limits" => {
                only_keys(&b, "limits", &["max_connections", "put_rate"])?;
                set_limit(
                    &b,
                    "max_connections",
                    u32::MAX.into(),
                    &mut user.limits.max_connections,
                )?;
                let rate = crate::config::MAX_USER_PUT_RATE;
                set_limit(&b, "put_rate", rate, &mut user.limits.put_rate)?;
            }
            "password" => {
                only_keys(&b, "a password", &["password"])?;
                let p = b["password"]
                    .as_str()
                    .ok_or((400, "password: a string is required".to_owned()))?;
                user.hash2 = Some(tarq_iproto::auth::hash2(p));
            }
            _ => {
                access::apply(&mut user, &grant_of(&b)?, action == "grant");
            }
        }
        self.l
            .dispatch(self.idx, reply, Command::PutUser { user: &user });
        Ok(())
    }

    /// `guest` and the bootstrap administrator (configuration, not data).
    fn is_system_user(&self, name: &str) -> bool {
        name == GUEST
            || self
                .l
                .config()
                .auth
                .as_ref()
                .is_some_and(|c| c.user == name)
    }

    // ---- reads ----

    /// The tube named `name` (percent-decoded), or 404.
    fn tube(&self, name: &str) -> Result<TubeIx, Refused> {
        match self.l.tube_named(name) {
            Some((t, _)) => Ok(t),
            None => refused(404, "Tube not found"),
        }
    }

    /// The tube named `name` if the request's user may see it (some right on it), or 404 as
    /// for a tube that is not there: a user learns nothing of the tubes it may not touch, as
    /// on the beanstalk port.
    fn seen_tube(&self, name: &str) -> Result<TubeIx, Refused> {
        let t = self.tube(name)?;
        if !self.who.allows(self.l.queue().users(), Need::AnyOn(name)) {
            return refused(404, "Tube not found");
        }
        Ok(t)
    }

    /// What the request's user may do on tube `name`, for the console to show only the
    /// actions it may take.
    fn rights_json(&self, name: &str) -> Value {
        let users = self.l.queue().users();
        Value::from(self.who.rights_on(users, name).names())
    }

    /// Tube `t` as the API shows it: on a sharded cluster the whole tube (`totals`: summed
    /// over its partitions by the console's gather) with its `partitions`, else this node's.
    fn tube_json(
        &self,
        t: TubeIx,
        holders: &[u64],
        totals: Option<&HashMap<String, TubeTotals>>,
    ) -> Option<Value> {
        let q = self.l.queue();
        let info = q.tube_info(t)?;
        let whole = totals.and_then(|all| all.get(info.name));
        let stats = match whole {
            Some(w) => w.stats,
            None => self.l.tube_figures(t, holders)?,
        };
        let mono = self.l.mono();
        let paused = (self.l.pauses().of(t))
            .filter(|p| p.until > mono)
            .map(|p| (p.until - mono) as f64 / SECOND);
        let mut v = json::tube(&info, &stats, self.l.live().tube_now(info.name), paused);
        v["rights"] = self.rights_json(info.name);
        if let Some(w) = whole {
            v["partitions"] = json::partitions(&w.partitions);
        }
        Some(v)
    }

    /// `?offset=N&limit=M` over the tubes in the queue's order.
    fn list_tubes(&mut self) -> Result<(), Refused> {
        self.allow(Need::Any, "the tubes")?;
        let q = Query::parse(self.head.query)?;
        let offset = q.number("offset")?.unwrap_or(0) as usize;
        let limit = q.limit()?;
        let totals = self.l.cluster_tubes();
        let queue = self.l.queue();
        // A tube once, by its first partition: the others this node holds are its parts.
        // Only those the user may see (some right on them).
        let users = queue.users();
        let seen = |name: &str| self.who.allows(users, Need::AnyOn(name));
        let heads = || (queue.tubes()).filter(|t| t.opts.part == 0 && seen(t.name));
        let total = heads().count();
        let ixs: Vec<TubeIx> = heads().skip(offset).take(limit).map(|t| t.ix).collect();
        let holders = self.l.queue().holders();
        let tubes: Vec<Value> = (ixs.iter())
            .filter_map(|&t| self.tube_json(t, &holders, totals.as_deref()))
            .collect();
        let next = (offset + tubes.len() < total).then_some(offset + tubes.len());
        let v = json!({ "tubes": tubes, "total": total, "offset": offset, "next": next });
        self.send_json(200, &v);
        Ok(())
    }

    fn one_tube(&mut self, name: &str) -> Result<(), Refused> {
        let t = self.seen_tube(name)?;
        let totals = self.l.cluster_tubes();
        let holders = self.l.queue().holders();
        let v = self
            .tube_json(t, &holders, totals.as_deref())
            .ok_or((404, "Tube not found".to_owned()))?;
        self.send_json(200, &v);
        Ok(())
    }

    /// `?status=ready&after=ID&limit=N`: the tasks in the order the tube keeps them. On a
    /// sharded cluster the whole tube's, partition by partition, each task with its
    /// `partition`: the router asks the owners and answers once they have (or after a bounded
    /// wait, naming those that did not in `unanswered`).
    fn list_tasks(&mut self, name: &str) -> Result<(), Refused> {
        self.seen_tube(name)?;
        self.allow(Need::Tasks(name), &format!("the tasks of tube '{name}'"))?;
        let (t, numbers) = (self.l.tube_named(name)).ok_or((404, "Tube not found".to_owned()))?;
        let q = Query::parse(self.head.query)?;
        let status = match q.get("status") {
            None => Status::Ready,
            Some(s) => json::parse_status(s).ok_or((
                400,
                format!("status {s:?}: one of ready, delayed, buried, taken"),
            ))?,
        };
        let limit = q.limit()?;
        if self.l.sharded() {
            let after = q.number("after")?.map(|n| numbers.id_of(t, n));
            let reply = self.reply(Answer::Ok, t, numbers.first);
            let cmd = Command::ListTasks {
                tube: t,
                status,
                after,
                limit: limit as u32,
            };
            self.l.dispatch(self.idx, reply, cmd);
            return Ok(());
        }
        let queue = self.l.queue();
        let first = queue.tube_numbers(t).first;
        let after = q.number("after")?.map(|n| queue.task_id_in(t, n));
        let tasks = queue
            .list(t, status, after, limit + 1)
            .map_err(|e| (404, e.to_string()))?;
        let more = tasks.len() > limit;
        let shown: Vec<Value> = tasks
            .iter()
            .take(limit)
            .map(|task| json::task_preview(task, t, first))
            .collect();
        let next = more
            .then(|| shown.last().and_then(|v| v["id"].as_u64()))
            .flatten();
        let v = json!({
            "tube": name,
            "status": json::status_name(status),
            "tasks": shown,
            "next_after": next,
        });
        self.send_json(200, &v);
        Ok(())
    }

    /// A task by its id, through the core: on a sharded cluster its partition's owner
    /// answers, whichever node the console is on.
    fn peek(&mut self, name: &str, id: &str) -> Result<(), Refused> {
        self.seen_tube(name)?;
        self.allow(Need::Tasks(name), &format!("the tasks of tube '{name}'"))?;
        let (t, numbers) = self
            .l
            .tube_named(name)
            .ok_or((404, "Tube not found".to_owned()))?;
        let number = task_number(id)?;
        let id = numbers.id_of(t, number);
        let reply = self.reply(Answer::Task, t, numbers.first);
        self.l
            .dispatch(self.idx, reply, Command::Peek { tube: t, id });
        Ok(())
    }

    // ---- actions ----

    fn body(&self) -> Result<Value, Refused> {
        if self.body.is_empty() {
            return Ok(json!({}));
        }
        let v: Value = serde_json::from_slice(self.body)
            .map_err(|e| (400, format!("the body is not JSON: {e}")))?;
        if !v.is_object() {
            return refused(400, "the body must be a JSON object");
        }
        Ok(v)
    }

    fn create_tube(&mut self) -> Result<(), Refused> {
        let b = self.body()?;
        let name = b["name"]
            .as_str()
            .ok_or((400, "name: a string is required".to_owned()))?;
        let need = Need::Tube(name, Rights::ADMIN);
        self.check_action(need, &format!("the creation of tube '{name}'"))?;
        if matches!(name, "." | "..") {
            // Browsers read `.` and `..` (also `%2E%2E`) as steps in the path, so the tube
            // could never be reached at /api/tubes/NAME; any other name can, percent-encoded.
            return refused(
                400,
                format!("name {name:?}: a URL path cannot name this tube; choose another name"),
            );
        }
        let kind = b["type"].as_str().unwrap_or("fifottl");
        let kind = TubeType::parse(kind).map_err(|e| {
            let e = crate::core::Refusal::Queue(e);
            (400, json::error_text(&e, DEFAULT_TUBE, 0))
        })?;
        let o = &b["options"];
        let o = if o.is_object() {
            only_keys(&b, "a tube's creation", CREATE_KEYS)?;
            only_keys(o, "a tube's options", TUBE_OPTION_KEYS)?;
            o
        } else {
            let all: Vec<&str> = CREATE_KEYS
                .iter()
                .chain(TUBE_OPTION_KEYS)
                .copied()
                .collect();
            only_keys(&b, "a tube's creation", &all)?;
            &b
        };
        let opts = TubeOptions {
            ttl: seconds(o, "ttl")?,
            ttr: seconds(o, "ttr")?,
            pri: integer(o, "pri")?.unwrap_or(0),
            capacity: integer(o, "capacity")?.map_or(0, |c: i64| c.max(0) as u64),
            max_deliveries: integer(o, "max_deliveries")?
                .map_or(0, |m: i64| m.clamp(0, u16::MAX as i64) as u16),
            dedup_window: seconds(o, "dedup_window")?.unwrap_or(0),
            temporary: o["temporary"].as_bool().unwrap_or(false),
            on_demand: false,
            part: 0,
        };
        let partitions = integer(o, "partitions")?.unwrap_or(1);
        if !(1..=i64::from(u16::MAX)).contains(&partitions) {
            return refused(400, format!("partitions {partitions}: 1 or more"));
        }
        let cmd = Command::CreateTube {
            name,
            kind,
            opts,
            if_not_exists: b["if_not_exists"].as_bool().unwrap_or(false),
            partitions: partitions as u16,
        };
        let reply = self.reply(Answer::Created, DEFAULT_TUBE, 0);
        self.l.dispatch(self.idx, reply, cmd);
        Ok(())
    }

    /// A put: `data` (text or any JSON value) or `data_base64` (bytes), with the put's
    /// options `delay`, `ttl`, `ttr` (seconds), `pri`, `utube`.
    fn put(&mut self, name: &str) -> Result<(), Refused> {
        let need = Need::Tube(name, Rights::PUT);
        self.check_action(need, &format!("a put into tube '{name}'"))?;
        let t = self.tube(name)?;
        let b = self.body()?;
        only_keys(&b, "a put", PUT_KEYS)?;
        let mut data = Vec::new();
        match (&b["data"], &b["data_base64"]) {
            (Value::Null, Value::String(s)) => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|e| (400, format!("data_base64 is not base64: {e}")))?;
                tarq_iproto::mp::write::bin(&mut data, &bytes);
            }
            (Value::Null, Value::Null) => return refused(400, "data or data_base64 is required"),
            (Value::String(s), Value::Null) => tarq_iproto::mp::write::str(&mut data, s),
            (v, Value::Null) => {
                rmpv::encode::write_value(&mut data, &crate::ctl::from_json(v))
                    .map_err(|e| (400, format!("data: {e}")))?;
            }
            _ => return refused(400, "data and data_base64 both given: send one"),
        }
        let utube = b["utube"].as_str().unwrap_or("").as_bytes();
        let opts = TubePut {
            delay: seconds(&b, "delay")?.unwrap_or(0),
            ttl: seconds(&b, "ttl")?,
            ttr: seconds(&b, "ttr")?,
            pri: integer(&b, "pri")?,
            utube,
            dedup_key: None,
        };
        let first = self.l.queue().tube_numbers(t).first;
        let cmd = Command::PutIn {
            tube: t,
            data: &data,
            opts,
            wait: 0,
        };
        let reply = self.reply(Answer::Put, t, first);
        self.l.dispatch(self.idx, reply, cmd);
        Ok(())
    }

    fn tube_action(&mut self, name: &str, action: &str) -> Result<(), Refused> {
        if !matches!(action, "kick" | "pause" | "resume" | "truncate" | "drop") {
            return refused(
                404,
                format!("no action {action}: kick, pause, resume, truncate, drop"),
            );
        }
        let need = Need::Tube(name, Rights::ADMIN);
        self.check_action(need, &format!("{action} of tube '{name}'"))?;
        let tube = self.tube(name)?;
        let b = self.body()?;
        let keys: &[&str] = match action {
            "kick" => &["count"],
            "pause" => &["seconds"],
            _ => &[],
        };
        only_keys(&b, &format!("a {action}"), keys)?;
        let first = self.l.queue().tube_numbers(tube).first;
        let (answer, cmd) = match action {
            "kick" => {
                let count = integer(&b, "count")?.unwrap_or(1);
                if count < 0 {
                    return refused(400, format!("count {count}: a count is 0 or more"));
                }
                (
                    Answer::Kicked,
                    Command::Kick {
                        tube,
                        count: count as u64,
                    },
                )
            }
            "pause" | "resume" => {
                let secs = match action {
                    "resume" => 0,
                    _ => integer(&b, "seconds")?.unwrap_or(60),
                };
                if !(0..=MAX_PAUSE_SECONDS as i64).contains(&secs) {
                    return refused(
                        400,
                        format!("seconds {secs}: a pause is 0 to {MAX_PAUSE_SECONDS} seconds"),
                    );
                }
                let pause = Pause {
                    until: self.l.mono() + secs as Micros * SECOND as Micros,
                    seconds: secs as u32,
                };
                (Answer::Ok, Command::Pause { tube, pause })
            }
            "truncate" => (Answer::Ok, Command::Truncate { tube }),
            _ => (Answer::Ok, Command::DropTube { tube }),
        };
        let reply = self.reply(answer, tube, first);
        self.l.dispatch(self.idx, reply, cmd);
        Ok(())
    }

    fn task_action(&mut self, name: &str, id: &str, action: &str) -> Result<(), Refused> {
        if !matches!(action, "bury" | "kick" | "delete") {
            return refused(404, format!("no action {action}: bury, kick, delete"));
        }
        let need = Need::Tube(name, Rights::ADMIN);
        self.check_action(need, &format!("{action} of a task of tube '{name}'"))?;
        let (tube, numbers) = self
            .l
            .tube_named(name)
            .ok_or((404, "Tube not found".to_owned()))?;
        let number = task_number(id)?;
        let queue = self.l.queue();
        let first = numbers.first;
        let id = numbers.id_of(tube, number);
        // A partition this node holds (a sharded cluster's others are asked of their owners
        // by id, which the router sends where the id's partition is).
        let held = (tarq_engine::id_tube(id).and_then(|ix| queue.tube_info(ix)))
            .is_some_and(|i| i.name == name);
        let (answer, cmd) = match action {
            "bury" => (Answer::Task, Command::Bury { tube, id }),
            "delete" => (Answer::Done, Command::Delete { tube, id }),
            _ => {
                // kick-job finds a task in any tube: this one must be the tube's. A partition
                // held elsewhere is its owner's to check (the router sends the kick there).
                let at = tarq_engine::id_tube(id).filter(|_| held).unwrap_or(tube);
                match queue.peek(at, id) {
                    Err(tarq_engine::QueueError::NotFound(_)) if !held => {}
                    Err(e) => {
                        let e = crate::core::Refusal::Queue(e);
                        return refused(json::status_of(&e), json::error_text(&e, tube, first));
                    }
                    Ok(_) => {}
                }
                (Answer::Task, Command::KickTask { id })
            }
        };
        let reply = self.reply(answer, tube, first);
        self.l.dispatch(self.idx, reply, cmd);
        Ok(())
    }
}

/// A segment of `path` (or a query value) with its percent-escapes decoded; it must be UTF-8.
fn decode_path(segment: &str, path: &str) -> Result<String, Refused> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or((400, format!("a bad percent-escape in the path {path:?}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| (400, "the path is not UTF-8 once decoded".to_owned()))
}

/// Whether a path names a route under another method.
fn known_path(parts: &[&str]) -> bool {
    matches!(
        parts,
        ["api", "tubes"]
            | ["api", "tubes", _]
            | ["api", "tubes", _, "tasks"]
            | ["api", "tubes", _, "tasks", _]
            | ["api", "tubes", _, _]
            | ["api", "tubes", _, "tasks", _, _]
            | [
                "api",
                "server" | "cluster" | "users" | "events" | "history" | "openapi.json"
            ]
    )
}

/// The keys of a put's body.
const PUT_KEYS: &[&str] = &["data", "data_base64", "delay", "ttl", "ttr", "pri", "utube"];

/// The options of a tube, in `options` or beside `name` in a create's body.
const TUBE_OPTION_KEYS: &[&str] = &[
    "ttl",
    "ttr",
    "pri",
    "capacity",
    "max_deliveries",
    "dedup_window",
    "temporary",
    "partitions",
];

/// The keys of a create's body besides the options.
const CREATE_KEYS: &[&str] = &["name", "type", "options", "if_not_exists"];

/// Refuses a body (or its `options`) with a key outside `known`, naming it and the keys there
/// are: a misspelt option (`priority` for `pri`) would otherwise be ignored without a word.
fn only_keys(v: &Value, what: &str, known: &[&str]) -> Result<(), Refused> {
    let Some(map) = v.as_object() else {
        return Ok(());
    };
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) if known.is_empty() => {
            refused(400, format!("unknown key {k:?}: {what} takes none"))
        }
        Some(k) => refused(
            400,
            format!(
                "unknown key {k:?} in {what}: the keys are {}",
                known.join(", ")
            ),
        ),
    }
}

/// What a grant's or a revoke's body names: `{"tube", "rights": [...]}` or `{"cluster": true}`.
fn grant_of(b: &Value) -> Result<access::Grant, Refused> {
    only_keys(b, "a grant", &["tube", "rights", "cluster"])?;
    if b["cluster"].as_bool() == Some(true) {
        return Ok(access::Grant::Admin);
    }
    let tube = b["tube"]
        .as_str()
        .ok_or((400, "tube: a name (or \"*\"), or cluster: true".to_owned()))?;
    let names = b["rights"]
        .as_array()
        .ok_or((400, "rights: a list of put, take, admin".to_owned()))?;
    let mut rights = tarq_engine::Rights::NONE;
    for n in names {
        let r = n.as_str().and_then(tarq_engine::Rights::named);
        let r = r.ok_or((400, format!("rights: {n} is not put, take or admin")))?;
        rights = rights.union(r);
    }
    Ok(access::Grant::Tube(tube.to_owned(), rights))
}

/// A user's own limit `key` as the body sets it: a number (0: no limit for this user) up to
/// `max`, `null` (the server's setting again), or absent (left as it is).
fn set_limit(b: &Value, key: &str, max: u64, slot: &mut Option<u32>) -> Result<(), Refused> {
    match &b[key] {
        _ if b.get(key).is_none() => {}
        Value::Null => *slot = None,
        v => match v.as_u64().filter(|&n| n <= max) {
            Some(n) => *slot = Some(n as u32),
            None => {
                let why =
                    format!("{key} {v}: a whole number from 0 to {max}, or null for the server's");
                return refused(400, why);
            }
        },
    }
    Ok(())
}

fn task_number(id: &str) -> Result<u64, Refused> {
    id.parse()
        .map_err(|_| (400, format!("task id {id:?}: a number is expected")))
}

/// Seconds of `v[key]` as the engine's microseconds; `None` when absent or null.
fn seconds(v: &Value, key: &str) -> Result<Option<Micros>, Refused> {
    match &v[key] {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_f64() {
            Some(s) if (0.0..1e12).contains(&s) => Ok(Some((s * SECOND) as Micros)),
            _ => refused(400, format!("{key}: {n} seconds is out of range")),
        },
        other => refused(400, format!("{key}: seconds expected, got {other}")),
    }
}

fn integer(v: &Value, key: &str) -> Result<Option<i64>, Refused> {
    match &v[key] {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_i64()
            .map(Some)
            .ok_or((400, format!("{key}: {n} is not an integer"))),
        other => refused(400, format!("{key}: an integer expected, got {other}")),
    }
}

/// A query string's pairs.
struct Query<'q>(Vec<(&'q str, String)>);

impl<'q> Query<'q> {
    fn parse(q: &'q str) -> Result<Self, Refused> {
        let mut pairs = Vec::new();
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            pairs.push((k, decode_path(&v.replace('+', " "), q)?));
        }
        Ok(Query(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, key: &str) -> Result<Option<u64>, Refused> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| (400, format!("{key} {v:?}: a whole number is expected"))),
        }
    }

    /// `limit`, 1 to [`MAX_PAGE`] ([`DEFAULT_PAGE`] when absent).
    fn limit(&self) -> Result<usize, Refused> {
        match self.number("limit")? {
            None => Ok(DEFAULT_PAGE),
            Some(n) if (1..=MAX_PAGE as u64).contains(&n) => Ok(n as usize),
            Some(n) => refused(400, format!("limit {n}: 1 to {MAX_PAGE}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_decode_and_must_be_utf8() {
        assert_eq!(decode_path("a%20b%2Fc", "/").unwrap(), "a b/c");
        assert_eq!(decode_path("%ff", "/").unwrap_err().0, 400);
        assert_eq!(decode_path("%zz", "/").unwrap_err().0, 400);
    }

    #[test]
    fn unknown_keys_are_named_with_the_keys_there_are() {
        let body = json!({"data": "x", "priority": 3});
        let (status, why) = only_keys(&body, "a put", PUT_KEYS).unwrap_err();
        assert_eq!(status, 400);
        assert_eq!(
            why,
            "unknown key \"priority\" in a put: the keys are data, data_base64, delay, ttl, \
             ttr, pri, utube"
        );
        assert!(only_keys(&json!({"data": 1, "pri": 2}), "a put", PUT_KEYS).is_ok());
    }
}
