//! The Grafana dashboard in `packaging/grafana/tarq.json`, checked against a live `/metrics`:
//! a primary and its replica (real `tarq` processes) are put to work, their pages scraped,
//! and every query of the dashboard is run by `promtool test rules` over those samples (each
//! series held at its scraped value for five minutes). A query that does not parse, or that
//! returns nothing (a misspelt metric or label, a figure tarq no longer serves), fails the
//! test, naming its panel. The variables' `label_values` metrics must be on the pages too.

mod support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::Command;

use rmpv::Value;
use serde_json::Value as Json;
use support::{http_get, prerequisite, tool, wait_until, Client, Tarq};

/// Where the dashboard lives, from this crate's directory.
const DASHBOARD: &str = "../packaging/grafana/tarq.json";

/// What Grafana puts in a query before it sends it, as the test puts it: every instance and
/// tube, and a rate window longer than two scrapes.
fn grafana_substitutes(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "5m")
        .replace("$instance", ".*")
        .replace("$tube", ".*")
}

/// Every (panel title, expr) of the dashboard, rows' panels included.
fn queries(dash: &Json) -> Vec<(String, String)> {
    fn walk(panels: &[Json], out: &mut Vec<(String, String)>) {
        for p in panels {
            let title = p["title"].as_str().unwrap_or("?").to_owned();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("a Prometheus target has an expr");
                out.push((title.clone(), expr.to_owned()));
            }
            if let Some(inner) = p["panels"].as_array() {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dash["panels"].as_array().expect("panels"), &mut out);
    out
}

/// The samples of a /metrics page as promtool's input series, each labelled with `instance`
/// and held at its value: `(series, values)`.
fn series(page: &str, instance: &str) -> Vec<(String, String)> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("a sample line is NAME VALUE");
            let labels = format!("instance=\"{instance}\",job=\"tarq\"");
            let series = match name.split_once('{') {
                Some((metric, rest)) => format!("{metric}{{{labels},{rest}"),
                None => format!("{name}{{{labels}}}"),
            };
            let value: f64 = value.parse().expect("a sample's value is a number");
            (series, format!("{value}x20"))
        })
        .collect()
}

/// The metric names a page serves.
fn names(page: &str) -> BTreeSet<String> {
    page.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A YAML single-quoted scalar.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A locked server (`--user`) with a user held to a put rate of 2 a second: bob's connection
/// and the puts it had delayed are on its page (the per-user figures appear with users).
fn users_at_work(scrape: &dyn Fn(&Tarq) -> String) -> String {
    let locked = Tarq::start(&[
        "--http-listen",
        "127.0.0.1:0",
        "--user",
        "admin",
        "--password",
        "boot",
        "--user-put-rate",
        "2",
    ]);
    let login = |user: &str, password: &str| {
        let mut c = Client::connect(locked.addr);
        let salt = c.greeting.salt.clone();
        let scramble = tarq_iproto::auth::scramble(&salt, password);
        let r = c.request(|o, sync| tarq_iproto::client::auth(o, sync, user, &scramble));
        assert_eq!(r.code, 0, "{user} logs in: {r:?}");
        c
    };
    let mut admin = login("admin", "boot");
    let opts = support::map(&[("password", Value::from("pw"))]);
    admin
        .call("box.schema.user.create", &[Value::from("bob"), opts])
        .ok();
    let grant = ["bob", "put", "tube", "default"].map(Value::from);
    admin.call("box.schema.user.grant", &grant).ok();
    let mut bob = login("bob", "pw");
    for n in 0..4 {
        bob.call("queue.put", &[Value::from(n)]).one();
    }
    let mut page = String::new();
    wait_until("bob's delayed puts on the page", || {
        page = scrape(&locked);
        page.contains("tarq_user_connections{user=\"bob\"} 1")
            && !page.contains("tarq_user_puts_delayed_total{user=\"bob\"} 0")
    });
    page
}

#[test]
fn every_dashboard_query_returns_data_from_a_live_primary_and_replica() {
    let promtool = prerequisite("promtool (Debian package prometheus)", tool("promtool"));
    let text = std::fs::read_to_string(DASHBOARD).expect("the dashboard is in packaging/");
    let dash: Json = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert_eq!(dash["uid"], "tarq-overview");
    assert_eq!(
        dash["__inputs"][0]["name"], "DS_PROMETHEUS",
        "importable with any Prometheus"
    );

    // A primary with a tube at work (a consumer holding a task, one waiting) and its replica.
    let primary = Tarq::start(&["--http-listen", "127.0.0.1:0"]);
    let replica = Tarq::start(&[
        "--http-listen",
        "127.0.0.1:0",
        "--replica-of",
        &primary.addr.to_string(),
    ]);
    let mut c = Client::connect(primary.addr);
    c.call(
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl")],
    )
    .one();
    for n in 0..5 {
        c.call("queue.tube.jobs:put", &[Value::from(n)]).one();
    }
    let mut holder = Client::connect(primary.addr);
    let task = holder.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    holder
        .call(
            "queue.tube.jobs:ack",
            &[task.as_array().unwrap()[0].clone()],
        )
        .one();
    holder.call("queue.tube.jobs:take", &[Value::from(0)]).one();
    c.call("queue.put", &[Value::from("seed")]).one();

    let scrape = |t: &Tarq| http_get(t.metrics.expect("the HTTP port"), "/metrics").1;
    let mut replica_page = String::new();
    wait_until("the replica to apply the primary's tasks", || {
        replica_page = scrape(&replica);
        replica_page.contains("tarq_replication_lag_records 0")
            && replica_page.contains("tarq_tube_tasks{tube=\"jobs\"} 4")
    });
    let primary_page = scrape(&primary);
    let users_page = users_at_work(&scrape);
    assert!(
        primary_page.contains("tarq_tube_takers_holding{tube=\"jobs\"} 1"),
        "{primary_page}"
    );

    let served: BTreeSet<String> = names(&primary_page)
        .into_iter()
        .chain(names(&replica_page))
        .collect();
    for v in dash["templating"]["list"].as_array().expect("variables") {
        let q = v["definition"].as_str().expect("a query variable");
        let metric = q
            .strip_prefix("label_values(")
            .and_then(|r| r.split(',').next())
            .expect("label_values(METRIC, LABEL)");
        assert!(
            served.contains(metric),
            "variable {}: {metric} is not served",
            v["name"]
        );
    }

    // Each query as an alert on its absence: promtool fails the test for any that fires.
    let queries = queries(&dash);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut tests = String::from(
        "rule_files: [rules.yml]\nevaluation_interval: 1m\ntests:\n  - interval: 15s\n    input_series:\n",
    );
    for (s, values) in series(&primary_page, "primary")
        .into_iter()
        .chain(series(&replica_page, "replica"))
        .chain(series(&users_page, "users"))
    {
        let _ = writeln!(
            tests,
            "      - series: {}\n        values: {}",
            quoted(&s),
            quoted(&values)
        );
    }
    tests.push_str("    alert_rule_test:\n");
    for (i, (title, expr)) in queries.iter().enumerate() {
        let alert = format!("query_{i}");
        let _ = writeln!(
            rules,
            "      - alert: {alert}\n        expr: {}\n        labels: {{panel: {}}}",
            quoted(&format!("absent({})", grafana_substitutes(expr))),
            quoted(title)
        );
        let _ = writeln!(
            tests,
            "      - eval_time: 4m\n        alertname: {alert}\n        exp_alerts: []"
        );
    }
    std::fs::write(dir.path().join("rules.yml"), &rules).unwrap();
    std::fs::write(dir.path().join("tests.yml"), &tests).unwrap();
    let out = Command::new(&promtool)
        .args(["test", "rules", "tests.yml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool: a query of the dashboard does not parse or returns nothing (its panel is \
         the alert's label):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // And the check can fail: a query of a metric tarq does not serve is caught.
    let bad = rules.replace("tarq_tube_takers_waiting", "tarq_tube_takers_wating");
    std::fs::write(dir.path().join("rules.yml"), bad).unwrap();
    let out = Command::new(&promtool)
        .args(["test", "rules", "tests.yml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "a misspelt metric went unnoticed");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("Consumers by tube"), "{said}");
}
