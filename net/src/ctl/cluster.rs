//! `tarq ctl cluster`: the members, the leader, the term and each replica's lag, from the
//! server's `queue.cluster()` — a map `{leader = {name, addr} or nil, term = N, members =
//! {{name, addr, role, ...}, ...}}` as etcd holds them — with each member's own position and
//! lag asked of that member. A server in no etcd cluster (no `members`; or an older one
//! without the call: ER_NO_SUCH_PROC) gets the fallback: each `--addr`'s own replication figures from
//! `queue.stats()` (`replicas`, `replication_*`), one row per address, an unreachable one
//! saying why. The printing reads keys by name and shows `-` for any it does not find, so a
//! server that sends more or fewer keys still prints.
//!
//! A sharded cluster (the map has `sets`, from nodes started with `--replica-set`) gets two
//! more tables: every replica set with its primary, term and members, and the placement (each
//! tube's partitions: index and owning set) with each partition's counts. The sets and the
//! placement are the asked node's view of etcd's map, through `queue.cluster()` rather than
//! etcd itself, so ctl needs only the tarq address it already has; the counts are the owners'
//! own: each set's primary is asked its `queue.cluster()`, which counts the partitions its set
//! owns (a replica's would lag; a non-owner's are not given).
//!
//! etcd's view lags the nodes' own: a leader whose lease could not be refreshed (etcd
//! unreachable, the process stalled) stops leading at once, while etcd still names it until
//! the lease expires, and not at all while etcd is unreachable. So each member's own word
//! (`role`, `state`, `etcd_error` of its `queue.cluster()`) is shown beside etcd's: the
//! header says when the named leader is not leading now, and each node that cannot reach etcd
//! is named with the error.

use std::io::Write;

use rmpv::Value;
use tarq_client::cluster::{map_get, Cluster, Effect, Options};
use tarq_client::Client;
use tarq_iproto::codes::ER_NO_SUCH_PROC;

use super::to_json;

/// The member keys shown, in order, with their column titles (`role` is etcd's word, `now`
/// the member's own; the last column, so the ones before keep their place).
const MEMBER_COLUMNS: [(&str, &str); 7] = [
    ("name", "NAME"),
    ("addr", "ADDRESS"),
    ("role", "ROLE"),
    ("position", "POSITION"),
    ("lag_records", "LAG RECORDS"),
    ("lag_ms", "LAG MS"),
    ("now", "NOW"),
];

/// The `queue.stats()` figures of the fallback, with their column titles.
const STATS_COLUMNS: [(&str, &str); 7] = [
    ("replicas", "REPLICAS"),
    ("replication_connected", "CONNECTED"),
    ("replication_position", "POSITION"),
    ("replication_lag_records", "LAG RECORDS"),
    ("replication_lag_bytes", "LAG BYTES"),
    ("replication_lag_ms", "LAG MS"),
    ("replication_joins", "JOINS"),
];

/// Prints the cluster as `queue.cluster()` tells it, or each address's figures.
pub fn run(
    cluster: &mut Cluster,
    opts: &Options,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let reply = cluster.call("queue.cluster", &[0x90], None, Effect::Reads);
    // Without etcd there are no members to list (`queue.cluster()` is this node's view only):
    // each address's own figures say more.
    let standalone = match &reply {
        Ok(values) => values
            .first()
            .is_some_and(|m| map_get(m, "members").is_none()),
        Err(e) => e.server().is_some_and(|(code, _)| code == ER_NO_SUCH_PROC),
    };
    match reply {
        _ if standalone => {
            let asked = cluster.addr().unwrap_or("the server").to_string();
            let rows: Vec<(String, Result<Value, String>)> = cluster
                .addrs()
                .iter()
                .map(|a| (a.clone(), stats_of(a, opts)))
                .collect();
            if json {
                let doc: serde_json::Map<String, serde_json::Value> = rows
                    .iter()
                    .map(|(a, r)| {
                        let v = match r {
                            Ok(stats) => replication_json(stats),
                            Err(e) => serde_json::json!({ "error": e }),
                        };
                        (a.clone(), v)
                    })
                    .collect();
                writeln!(out, "{}", serde_json::Value::Object(doc))?;
            } else {
                writeln!(
                    out,
                    "no etcd cluster (no failover) at {asked}: the replication figures of each address's queue.stats()"
                )?;
                write!(out, "{}", render_stats(&rows))?;
            }
            Ok(())
        }
        Ok(values) => {
            let map = with_member_figures(values.into_iter().next().unwrap_or(Value::Nil), opts);
            let map = with_partition_counts(map, opts);
            if json {
                writeln!(out, "{}", serde_json::to_string(&to_json(&map))?)?;
            } else {
                write!(out, "{}", render_cluster(&map))?;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// etcd's member entries say who is where; each member's position and lag are its own, so
/// each member is asked (its `queue.cluster()`: `position_term`/`position`, and a replica's
/// `upstream` lag) and its row gets `position` (`term:lsn`), `lag_records` and `lag_ms`, and
/// its own word: `leading` (whether it takes changes now), `state` (why not, in its words),
/// `etcd_error` (while it cannot reach etcd). A member that does not answer keeps `-` there
/// and gets `error` instead.
fn with_member_figures(mut map: Value, opts: &Options) -> Value {
    let Value::Map(entries) = &mut map else {
        return map;
    };
    for (k, v) in entries.iter_mut() {
        if k.as_str() != Some("members") {
            continue;
        }
        let Value::Array(members) = v else { continue };
        for m in members.iter_mut() {
            let Some(addr) = map_get(m, "addr")
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                continue;
            };
            let own = call_on(&addr, opts, "queue.cluster");
            let Value::Map(fields) = m else { continue };
            let own = match own {
                Ok(own) => own,
                Err(e) => {
                    fields.push(("error".into(), e.into()));
                    continue;
                }
            };
            let leading = map_get(&own, "role").and_then(Value::as_str) == Some("leader");
            fields.push(("leading".into(), leading.into()));
            for key in ["state", "etcd_error"] {
                if let Some(v) = map_get(&own, key).filter(|v| !v.is_nil()) {
                    fields.push((key.into(), v.clone()));
                }
            }
            if let (Some(t), Some(p)) = (map_get(&own, "position_term"), map_get(&own, "position"))
            {
                fields.push((
                    "position".into(),
                    format!("{}:{}", cell(Some(t)), cell(Some(p))).into(),
                ));
            }
            if let Some(up) = map_get(&own, "upstream") {
                for key in ["lag_records", "lag_ms"] {
                    if let Some(x) = map_get(up, key) {
                        fields.push((key.into(), x.clone()));
                    }
                }
            }
        }
    }
    map
}

/// The counts of a partition, as `queue.cluster()` gives them for the partitions a node's
/// set owns, with their column titles.
const COUNT_COLUMNS: [(&str, &str); 5] = [
    ("ready", "READY"),
    ("taken", "TAKEN"),
    ("delayed", "DELAYED"),
    ("buried", "BURIED"),
    ("total", "TOTAL"),
];

/// A sharded cluster's partition counts, from their owners: each set's primary is asked its
/// `queue.cluster()`, and the counts it gives for the partitions its set owns (`owner_here`)
/// replace the asked node's in its `placement` (the asked node has counts only for its own
/// set's, and a replica's lag). A primary that does not answer gets `error` in its set's
/// entry, and its partitions keep no counts. A map without `sets` is returned as it is.
/// The counts a primary's `queue.cluster()` (`own`) gives of the partitions its set owns, by
/// index.
fn owned_counts(own: &Value) -> impl Iterator<Item = (u64, Vec<(Value, Value)>)> + '_ {
    partitions(own).filter_map(|p| {
        let here = map_get(p, "owner_here").and_then(Value::as_bool);
        let index = map_get(p, "index").and_then(Value::as_u64);
        let (Some(true), Some(index)) = (here, index) else {
            return None;
        };
        let figures: Vec<(Value, Value)> = (COUNT_COLUMNS.iter())
            .filter_map(|(k, _)| map_get(p, k).map(|v| (Value::from(*k), v.clone())))
            .collect();
        (!figures.is_empty()).then_some((index, figures))
    })
}

fn with_partition_counts(mut map: Value, opts: &Options) -> Value {
    let primaries: Vec<(String, String)> = match map_get(&map, "sets") {
        Some(Value::Array(sets)) => sets
            .iter()
            .filter_map(|set| {
                let name = map_get(set, "name")?.as_str()?;
                let addr = map_get(set, "primary").and_then(|p| map_get(p, "addr"))?;
                Some((name.to_owned(), addr.as_str()?.to_owned()))
            })
            .collect(),
        _ => return map,
    };
    // The counts of (set, index), and the sets whose primary did not answer.
    type Counts = Vec<(Value, Value)>;
    let mut counts: Vec<((String, u64), Counts)> = Vec::new();
    let mut errors: Vec<(String, String)> = Vec::new();
    // The moves each primary runs and ran (a move runs on its partition's owner).
    let mut moves: Vec<(String, Value)> = Vec::new();
    for (set, addr) in primaries {
        match call_on(&addr, opts, "queue.cluster") {
            Ok(own) => {
                if let Some(m) = map_get(&own, "moves").filter(|m| !m.is_nil()) {
                    moves.push((set.clone(), m.clone()));
                }
                counts.extend(owned_counts(&own).map(|(ix, f)| ((set.clone(), ix), f)));
            }
            Err(e) => errors.push((set, e)),
        }
    }
    if let Some(Value::Array(sets)) = map_get_mut(&mut map, "sets") {
        for set in sets.iter_mut() {
            let name = map_get(set, "name")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let Value::Map(fields) = set else { continue };
            if let Some((_, m)) = moves.iter().find(|(s, _)| Some(s) == name.as_ref()) {
                fields.push(("moves".into(), m.clone()));
            }
            let Some((_, e)) = errors.iter().find(|(s, _)| Some(s) == name.as_ref()) else {
                continue;
            };
            fields.push(("error".into(), e.as_str().into()));
        }
    }
    for p in partitions_mut(&mut map) {
        let set = map_get(p, "set").and_then(Value::as_str).map(str::to_owned);
        let index = map_get(p, "index").and_then(Value::as_u64);
        let Value::Map(fields) = p else { continue };
        fields.retain(|(k, _)| !COUNT_COLUMNS.iter().any(|(c, _)| k.as_str() == Some(c)));
        let (Some(set), Some(index)) = (set, index) else {
            continue;
        };
        if let Some((_, figures)) = counts.iter().find(|(key, _)| *key == (set.clone(), index)) {
            fields.extend(figures.iter().cloned());
        }
    }
    map
}

/// A connection to `addr`, authenticated when credentials were given.
pub(super) fn connect(addr: &str, opts: &Options) -> Result<Client, tarq_client::ClientError> {
    let mut c = Client::connect(addr, opts.timeout)?;
    if let Some((user, password)) = &opts.credentials {
        c.auth(user, password)?;
    }
    Ok(c)
}

/// Every partition entry of a `queue.cluster()` map's `placement`, tube after tube.
pub(super) fn partitions(map: &Value) -> impl Iterator<Item = &Value> {
    let tubes = match map_get(map, "placement").and_then(|p| map_get(p, "tubes")) {
        Some(Value::Array(tubes)) => tubes.as_slice(),
        _ => &[],
    };
    tubes
        .iter()
        .filter_map(|t| match map_get(t, "partitions") {
            Some(Value::Array(parts)) => Some(parts.iter()),
            _ => None,
        })
        .flatten()
}

fn partitions_mut(map: &mut Value) -> impl Iterator<Item = &mut Value> {
    let tubes = match map_get_mut(map, "placement").and_then(|p| map_get_mut(p, "tubes")) {
        Some(Value::Array(tubes)) => tubes.as_mut_slice(),
        _ => &mut [],
    };
    tubes
        .iter_mut()
        .filter_map(|t| match map_get_mut(t, "partitions") {
            Some(Value::Array(parts)) => Some(parts.iter_mut()),
            _ => None,
        })
        .flatten()
}

fn map_get_mut<'a>(map: &'a mut Value, key: &str) -> Option<&'a mut Value> {
    match map {
        Value::Map(pairs) => pairs
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v),
        _ => None,
    }
}

/// `queue.stats()` of one address, on a connection of its own (a replica's figures are its
/// own, so the fallback asks each node, not the leader).
fn stats_of(addr: &str, opts: &Options) -> Result<Value, String> {
    call_on(addr, opts, "queue.stats")
}

/// A call without arguments on `addr`, on a connection of its own.
pub(super) fn call_on(addr: &str, opts: &Options, function: &str) -> Result<Value, String> {
    let ask = || -> Result<Value, tarq_client::ClientError> {
        Ok(connect(addr, opts)?
            .call(function, &[0x90], None)?
            .into_iter()
            .next()
            .unwrap_or(Value::Nil))
    };
    ask().map_err(|e| e.to_string())
}

/// The replication part of a `queue.stats()` map, as JSON.
fn replication_json(stats: &Value) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("role".into(), role_of(stats).into());
    for (key, _) in STATS_COLUMNS {
        if let Some(v) = map_get(stats, key) {
            m.insert(key.into(), to_json(v));
        }
    }
    serde_json::Value::Object(m)
}

/// A node with replication figures of its own follows a primary; any other takes changes.
fn role_of(stats: &Value) -> &'static str {
    if map_get(stats, "replication_position").is_some() {
        "replica"
    } else {
        "primary"
    }
}

/// A value as one table cell: strings bare, numbers as numbers, nothing as `-`.
fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Nil) => "-".into(),
        Some(Value::String(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        Some(other) => to_json(other).to_string(),
    }
}

/// The `queue.cluster()` map as text: a header line (the leader etcd names, or that it is
/// not leading now, and the term), a line for each member that says something is wrong (not
/// leading, etcd unavailable, no answer), then one row per member.
pub fn render_cluster(map: &Value) -> String {
    let members = match map_get(map, "members") {
        Some(Value::Array(members)) => members.as_slice(),
        _ => &[],
    };
    let mut notes = Vec::new();
    let leader = leader_cell(map, members, &mut notes);
    let mut text = format!("leader {leader}  term {}\n", cell(map_get(map, "term")));
    let asked_alone = asked_alone(map, members);
    let speakers: Vec<&Value> = asked_alone.iter().chain(members).collect();
    let leader_name = map_get(map, "leader").and_then(|l| map_get(l, "name"));
    notes.extend(member_notes(&speakers, leader_name));
    notes.extend(etcd_notes(&speakers));
    for n in notes {
        text.push_str(&format!("  {n}\n"));
    }
    text.push_str(&member_table(members));
    if let Some(Value::Array(sets)) = map_get(map, "sets") {
        text.push_str(&render_sets(map, sets));
        text.push_str(&render_placement(map));
        text.push_str(&render_moves(sets));
    }
    text
}

/// The partition moves each set's primary runs now and ran since it started: a row per set
/// whose primary answered.
fn render_moves(sets: &[Value]) -> String {
    let titles = [
        "SET",
        "MOVING NOW",
        "COMMITTED",
        "GIVEN UP",
        "TASKS MOVED",
        "LAST MS",
    ];
    let mut rows = vec![titles.map(String::from).to_vec()];
    for set in sets {
        let Some(m) = map_get(set, "moves") else {
            continue;
        };
        let now = match map_get(m, "in_progress") {
            Some(p) if !p.is_nil() => format!(
                "{}/{} -> {} ({} sent)",
                cell(map_get(p, "tube")),
                cell(map_get(p, "partition")),
                cell(map_get(p, "to")),
                cell(map_get(p, "tasks"))
            ),
            _ => "-".into(),
        };
        rows.push(vec![
            cell(map_get(set, "name")),
            now,
            cell(map_get(m, "committed")),
            cell(map_get(m, "given_up")),
            cell(map_get(m, "tasks_moved")),
            cell(map_get(m, "last_ms")),
        ]);
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("\nmoves (by each set's primary)\n{}", table(&rows))
}

/// A sharded cluster's replica sets: a row per member (a set without members gets one row of
/// dashes), the set's primary's term on each, and a note for a set without a primary or whose
/// primary did not answer.
fn render_sets(map: &Value, sets: &[Value]) -> String {
    let mut text = format!(
        "\nreplica sets ({} of this node: {})\n",
        cell(map_get(map, "replica_set")),
        cell(map_get(map, "node"))
    );
    let mut rows = vec![["SET", "PRIMARY", "TERM", "NODE", "ADDRESS", "ROLE"]
        .map(String::from)
        .to_vec()];
    let mut notes = Vec::new();
    for set in sets {
        let name = cell(map_get(set, "name"));
        let primary = map_get(set, "primary").filter(|p| !p.is_nil());
        let term = cell(primary.and_then(|p| map_get(p, "term")));
        let primary_name = cell(primary.and_then(|p| map_get(p, "name")));
        if primary.is_none() {
            notes.push(format!("set {name} has no primary now"));
        }
        if let Some(e) = map_get(set, "error") {
            notes.push(format!(
                "set {name}'s primary does not answer: {}; its partitions' counts are missing",
                cell(Some(e))
            ));
        }
        let members = match map_get(set, "members") {
            Some(Value::Array(m)) if !m.is_empty() => m.as_slice(),
            _ => {
                rows.push(vec![
                    name,
                    primary_name,
                    term,
                    "-".into(),
                    "-".into(),
                    "-".into(),
                ]);
                continue;
            }
        };
        for m in members {
            rows.push(vec![
                name.clone(),
                primary_name.clone(),
                term.clone(),
                cell(map_get(m, "name")),
                cell(map_get(m, "addr")),
                cell(map_get(m, "role")),
            ]);
        }
    }
    text.push_str(&table(&rows));
    for n in notes {
        text.push_str(&format!("  {n}\n"));
    }
    text
}

/// The placement: a row per partition of each tube, its index and owning set, and its counts
/// as its owner gave them (`-` where none did).
fn render_placement(map: &Value) -> String {
    let placement = map_get(map, "placement");
    let mut text = format!(
        "\nplacement epoch {}\n",
        cell(placement.and_then(|p| map_get(p, "epoch")))
    );
    if placement
        .and_then(|p| map_get(p, "valid"))
        .and_then(Value::as_bool)
        == Some(false)
    {
        text.push_str(
            "  this node's view of the placement may be stale (etcd not read in time): it \
             refuses changes on partitioned tubes until it reads etcd again\n",
        );
    }
    let mut rows = vec![["TUBE", "TYPE", "PARTITION", "INDEX", "SET"]
        .into_iter()
        .chain(COUNT_COLUMNS.iter().map(|(_, t)| *t))
        .map(String::from)
        .collect::<Vec<_>>()];
    let tubes = match placement.and_then(|p| map_get(p, "tubes")) {
        Some(Value::Array(tubes)) => tubes.as_slice(),
        _ => &[],
    };
    for t in tubes {
        let parts = match map_get(t, "partitions") {
            Some(Value::Array(parts)) => parts.as_slice(),
            _ => &[],
        };
        for p in parts {
            rows.push(
                [
                    cell(map_get(t, "name")),
                    cell(map_get(t, "type")),
                    cell(map_get(p, "partition")),
                    cell(map_get(p, "index")),
                    cell(map_get(p, "set")),
                ]
                .into_iter()
                .chain(COUNT_COLUMNS.iter().map(|(k, _)| cell(map_get(p, k))))
                .collect(),
            );
        }
    }
    text.push_str(&table(&rows));
    if tubes.is_empty() {
        text.push_str("(no tubes placed)\n");
    }
    text
}

/// A node as `name (addr)`.
fn named(l: &Value) -> String {
    format!(
        "{} ({})",
        cell(map_get(l, "name")),
        cell(map_get(l, "addr"))
    )
}

/// The header's leader: the one etcd names, or `none now` with a note when that member says
/// it is not leading.
fn leader_cell(map: &Value, members: &[Value], notes: &mut Vec<String>) -> String {
    match map_get(map, "leader") {
        None | Some(Value::Nil) => "none (no leader elected)".to_string(),
        // `{name, addr}` as the server names it; a bare address from an older one.
        Some(l @ Value::Map(_)) => {
            let own = members
                .iter()
                .find(|m| map_get(m, "name").is_some() && map_get(m, "name") == map_get(l, "name"));
            match own
                .and_then(|m| map_get(m, "leading"))
                .and_then(Value::as_bool)
            {
                Some(false) => {
                    let state = own.and_then(|m| map_get(m, "state"));
                    notes.push(format!(
                        "{} is named leader by etcd but is not leading now: {}",
                        named(l),
                        cell(state)
                    ));
                    "none now (see below)".to_string()
                }
                _ => named(l),
            }
        }
        v => cell(v),
    }
}

/// The node asked, as a member entry, when it is not among the members: it never reached
/// etcd, so it has no member list, and speaks for itself.
fn asked_alone(map: &Value, members: &[Value]) -> Option<Value> {
    let asked = map_get(map, "node");
    (asked.is_some() && !members.iter().any(|m| map_get(m, "name") == asked)).then(|| {
        let mut own = vec![
            ("name".into(), asked.cloned().unwrap_or(Value::Nil)),
            (
                "leading".into(),
                (map_get(map, "role").and_then(Value::as_str) == Some("leader")).into(),
            ),
        ];
        for key in ["state", "etcd_error"] {
            if let Some(v) = map_get(map, key).filter(|v| !v.is_nil()) {
                own.push((key.into(), v.clone()));
            }
        }
        Value::Map(own)
    })
}

/// A note for each node that does not answer, or neither leads nor follows (the leader etcd
/// names has its note from `leader_cell`).
fn member_notes(speakers: &[&Value], leader_name: Option<&Value>) -> Vec<String> {
    let mut notes = Vec::new();
    for m in speakers {
        let name = cell(map_get(m, "name"));
        let state = map_get(m, "state").and_then(Value::as_str);
        let leading = map_get(m, "leading").and_then(Value::as_bool);
        if let Some(e) = map_get(m, "error") {
            notes.push(format!("{name} does not answer: {}", cell(Some(e))));
        } else if leading == Some(false)
            && (leader_name.is_none() || map_get(m, "name") != leader_name)
            && state.is_some_and(|s| s != "following")
        {
            notes.push(format!(
                "{name} is not following a leader: {}",
                cell(map_get(m, "state"))
            ));
        }
    }
    notes
}

/// One note per distinct etcd error, naming the nodes that see it.
fn etcd_notes(speakers: &[&Value]) -> Vec<String> {
    let mut etcd: Vec<(String, Vec<String>)> = Vec::new();
    for m in speakers {
        let Some(e) = map_get(m, "etcd_error").and_then(Value::as_str) else {
            continue;
        };
        let name = cell(map_get(m, "name"));
        match etcd.iter_mut().find(|(err, _)| err == e) {
            Some((_, names)) => names.push(name),
            None => etcd.push((e.to_string(), vec![name])),
        }
    }
    etcd.into_iter()
        .map(|(e, names)| format!("etcd unavailable to {}: {e}", names.join(", ")))
        .collect()
}

/// The members' table, one row each.
fn member_table(members: &[Value]) -> String {
    let mut rows = vec![MEMBER_COLUMNS.iter().map(|(_, t)| t.to_string()).collect()];
    rows.extend(members.iter().map(|m| {
        MEMBER_COLUMNS
            .iter()
            .map(|(k, _)| match *k {
                "now" => now_of(m),
                k => cell(map_get(m, k)),
            })
            .collect()
    }));
    let mut text = table(&rows);
    if members.is_empty() {
        text.push_str("(no members listed)\n");
    }
    text
}

/// A member's own word in one cell: `leading`, `following`, `not-leading` (electing, etcd
/// unreachable, its lease ran out: the notes say which), `no-answer`, or `-` from a server
/// that does not say. One word each, so a row splits on whitespace.
fn now_of(m: &Value) -> String {
    if map_get(m, "error").is_some() {
        return "no-answer".into();
    }
    match (
        map_get(m, "leading").and_then(Value::as_bool),
        map_get(m, "state").and_then(Value::as_str),
    ) {
        (Some(true), _) => "leading".into(),
        (Some(false), Some("following")) => "following".into(),
        (Some(false), _) => "not-leading".into(),
        (None, _) => "-".into(),
    }
}

/// The fallback rows as text: each address, its role and its figures, or why it is missing.
fn render_stats(rows: &[(String, Result<Value, String>)]) -> String {
    let mut lines = vec![std::iter::once("ADDRESS".to_string())
        .chain(std::iter::once("ROLE".to_string()))
        .chain(STATS_COLUMNS.iter().map(|(_, t)| t.to_string()))
        .collect::<Vec<_>>()];
    let mut failures = String::new();
    for (addr, r) in rows {
        match r {
            Ok(stats) => lines.push(
                [addr.clone(), role_of(stats).to_string()]
                    .into_iter()
                    .chain(STATS_COLUMNS.iter().map(|(k, _)| cell(map_get(stats, k))))
                    .collect(),
            ),
            Err(e) => failures.push_str(&format!("{addr}: unreachable: {e}\n")),
        }
    }
    table(&lines) + &failures
}

/// Rows as left-aligned columns two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(s, w)| format!("{s:<w$}"))
            .collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, Value)]) -> Value {
        Value::Map(
            pairs
                .iter()
                .map(|(k, v)| (Value::from(*k), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn the_cluster_prints_with_missing_keys_as_dashes() {
        let m = map(&[
            ("leader", Value::from("127.0.0.1:3301")),
            ("term", Value::from(4u64)),
            (
                "members",
                Value::Array(vec![
                    map(&[
                        ("name", Value::from("n1")),
                        ("addr", Value::from("127.0.0.1:3301")),
                        ("role", Value::from("leader")),
                        ("position", Value::from(120u64)),
                        ("lag_records", Value::from(0u64)),
                        ("lag_ms", Value::from(0u64)),
                    ]),
                    map(&[
                        ("name", Value::from("n2")),
                        ("addr", Value::from("127.0.0.1:3302")),
                        ("role", Value::from("replica")),
                        ("lag_records", Value::from(7u64)),
                        ("extra", Value::from(true)),
                    ]),
                ]),
            ),
        ]);
        assert_eq!(
            render_cluster(&m),
            "leader 127.0.0.1:3301  term 4\n\
             NAME  ADDRESS         ROLE     POSITION  LAG RECORDS  LAG MS  NOW\n\
             n1    127.0.0.1:3301  leader   120       0            0       -\n\
             n2    127.0.0.1:3302  replica  -         7            -       -\n"
        );
        let bare = map(&[("leader", Value::Nil)]);
        assert_eq!(
            render_cluster(&bare),
            "leader none (no leader elected)  term -\n\
             NAME  ADDRESS  ROLE  POSITION  LAG RECORDS  LAG MS  NOW\n\
             (no members listed)\n"
        );
        assert!(render_cluster(&Value::Nil).contains("no members listed"));
        let alone = map(&[
            ("node", Value::from("n3")),
            ("role", Value::from("replica")),
            ("state", Value::from("waiting for etcd's first answer")),
            ("leader", Value::Nil),
            ("members", Value::Array(vec![])),
            (
                "etcd_error",
                Value::from("etcd at http://e:2379 unreachable"),
            ),
        ]);
        assert_eq!(
            render_cluster(&alone),
            "leader none (no leader elected)  term -\n  \
             n3 is not following a leader: waiting for etcd's first answer\n  \
             etcd unavailable to n3: etcd at http://e:2379 unreachable\n\
             NAME  ADDRESS  ROLE  POSITION  LAG RECORDS  LAG MS  NOW\n\
             (no members listed)\n"
        );
    }

    #[test]
    fn the_fallback_prints_each_address() {
        let primary = map(&[("replicas", Value::from(1u64)), ("total", 3u64.into())]);
        let replica = map(&[
            ("replicas", Value::from(0u64)),
            ("replication_connected", Value::from(1u64)),
            ("replication_position", Value::from(57u64)),
            ("replication_lag_records", Value::from(0u64)),
        ]);
        let rows = vec![
            ("a:1".to_string(), Ok(primary)),
            ("b:2".to_string(), Ok(replica)),
            ("c:3".to_string(), Err("cannot connect".to_string())),
        ];
        let text = render_stats(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ADDRESS  ROLE     REPLICAS  CONNECTED  POSITION  LAG RECORDS  LAG BYTES  LAG MS  JOINS"
        );
        assert_eq!(
            lines[1],
            "a:1      primary  1         -          -         -            -          -       -"
        );
        assert_eq!(
            lines[2],
            "b:2      replica  0         1          57        0            -          -       -"
        );
        assert_eq!(lines[3], "c:3: unreachable: cannot connect");
    }

    #[test]
    fn a_leader_etcd_names_that_is_not_leading_and_etcd_unavailable_are_said() {
        let etcd_down = "etcd at http://127.0.0.1:2379 unreachable: timeout";
        let stopped = "this node stopped leading term 4: its lease could not be refreshed in time";
        let m = map(&[
            (
                "leader",
                map(&[("name", "n1".into()), ("addr", "127.0.0.1:3301".into())]),
            ),
            ("term", Value::from(4u64)),
            (
                "members",
                Value::Array(vec![
                    map(&[
                        ("name", "n1".into()),
                        ("addr", "127.0.0.1:3301".into()),
                        ("role", "leader".into()),
                        ("leading", false.into()),
                        ("state", stopped.into()),
                        ("etcd_error", etcd_down.into()),
                    ]),
                    map(&[
                        ("name", "n2".into()),
                        ("addr", "127.0.0.1:3302".into()),
                        ("role", "replica".into()),
                        ("leading", false.into()),
                        ("state", "electing a primary".into()),
                        ("etcd_error", etcd_down.into()),
                    ]),
                    map(&[
                        ("name", "n3".into()),
                        ("addr", "127.0.0.1:3303".into()),
                        ("role", "replica".into()),
                        ("error", "cannot connect to 127.0.0.1:3303".into()),
                    ]),
                ]),
            ),
        ]);
        let text = render_cluster(&m);
        let want = format!(
            "leader none now (see below)  term 4\n  \
             n1 (127.0.0.1:3301) is named leader by etcd but is not leading now: {stopped}\n  \
             n2 is not following a leader: electing a primary\n  \
             n3 does not answer: cannot connect to 127.0.0.1:3303\n  \
             etcd unavailable to n1, n2: {etcd_down}\n\
             NAME  ADDRESS         ROLE     POSITION  LAG RECORDS  LAG MS  NOW\n\
             n1    127.0.0.1:3301  leader   -         -            -       not-leading\n\
             n2    127.0.0.1:3302  replica  -         -            -       not-leading\n\
             n3    127.0.0.1:3303  replica  -         -            -       no-answer\n"
        );
        assert_eq!(text, want);
    }

    #[test]
    fn a_leader_named_by_a_map_prints_as_name_and_address() {
        let m = map(&[
            (
                "leader",
                map(&[
                    ("name", Value::from("n2")),
                    ("addr", Value::from("127.0.0.1:3302")),
                ]),
            ),
            ("term", Value::from(5u64)),
        ]);
        let text = render_cluster(&m);
        assert!(
            text.starts_with("leader n2 (127.0.0.1:3302)  term 5\n"),
            "{text}"
        );
    }

    #[test]
    fn a_sharded_cluster_prints_its_sets_and_placement() {
        let member = |name: &str, addr: &str, role: &str| {
            map(&[
                ("name", name.into()),
                ("addr", addr.into()),
                ("role", role.into()),
            ])
        };
        let part = |p: u64, index: u64, set: &str, counts: &[u64]| {
            let mut fields = vec![
                ("partition", Value::from(p)),
                ("index", index.into()),
                ("set", set.into()),
            ];
            for ((k, _), n) in COUNT_COLUMNS.iter().zip(counts) {
                fields.push((k, (*n).into()));
            }
            map(&fields)
        };
        let m = map(&[
            ("node", "a1".into()),
            ("replica_set", "a".into()),
            (
                "sets",
                Value::Array(vec![
                    map(&[
                        ("name", "a".into()),
                        (
                            "primary",
                            map(&[
                                ("name", "a0".into()),
                                ("addr", "h:1".into()),
                                ("term", 7u64.into()),
                            ]),
                        ),
                        (
                            "members",
                            Value::Array(vec![
                                member("a0", "h:1", "primary"),
                                member("a1", "h:2", "replica"),
                            ]),
                        ),
                    ]),
                    map(&[
                        ("name", "b".into()),
                        ("primary", Value::Nil),
                        ("members", Value::Array(vec![])),
                    ]),
                ]),
            ),
            (
                "placement",
                map(&[
                    ("epoch", 31u64.into()),
                    ("valid", false.into()),
                    (
                        "tubes",
                        Value::Array(vec![map(&[
                            ("name", "jobs".into()),
                            ("type", "fifo".into()),
                            (
                                "partitions",
                                Value::Array(vec![
                                    part(0, 1, "a", &[1, 2, 0, 0, 3]),
                                    part(1, 2, "b", &[]),
                                ]),
                            ),
                        ])]),
                    ),
                ]),
            ),
        ]);
        let text = render_cluster(&m);
        let tail = &text[text.find("\nreplica sets").expect("the sets") + 1..];
        assert_eq!(
            tail,
            "replica sets (a of this node: a1)\n\
             SET  PRIMARY  TERM  NODE  ADDRESS  ROLE\n\
             a    a0       7     a0    h:1      primary\n\
             a    a0       7     a1    h:2      replica\n\
             b    -        -     -     -        -\n  \
             set b has no primary now\n\
             \n\
             placement epoch 31\n  \
             this node's view of the placement may be stale (etcd not read in time): it \
             refuses changes on partitioned tubes until it reads etcd again\n\
             TUBE  TYPE  PARTITION  INDEX  SET  READY  TAKEN  DELAYED  BURIED  TOTAL\n\
             jobs  fifo  0          1      a    1      2      0        0       3\n\
             jobs  fifo  1          2      b    -      -      -        -       -\n"
        );
    }
}
