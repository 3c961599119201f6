//! The console of a sharded cluster in a real browser (issue 39, item 1): two replica sets of
//! one `tarq` node each on one etcd, a tube of four partitions spread over them, and Debian's
//! chromium opening each node's console.
//! - the tube's row is the whole tube, once, with the counts `queue.statistics` gives, the same
//!   on both nodes' consoles;
//! - its page lists the four partitions with their owning sets, whose counts add up to it, and
//!   its task list the whole tube's tasks, each once with its partition, of both sets'
//!   partitions, paged on with "More";
//! - the cluster page shows both sets with their primaries, the members and the placement,
//!   and on the node that only received a move, its link to the other set (up) and the move
//!   the other set's primary ran, from its record;
//! - a task of the other set's partition is found by id from a node's console and buried
//!   there with its Bury button, which the other set's primary does;
//! - the per-second figures are the whole cluster's: with puts into a tube of one partition
//!   through its owner, the other node's console (whose engine did none of them) shows its
//!   put rate in the tube's row and points in its chart, captioned "whole cluster".
//!
//! Screenshots go to `results/http-console-shards-2026-11-29/`. Every wait has a deadline.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/cluster.rs"]
mod cluster;
mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use browser::{browser_present, Browser};
use cluster::{str_field, wait_for, Etcd, Nodes};
use rmpv::Value;
use serde_json::Value as Json;
use tarq_client::{pack_args, Client};

const USER: &str = "ops";
const PASSWORD: &str = "s3cret";

fn results() -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../results/http-console-shards-2026-11-29");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn client(addr: SocketAddr) -> Client {
    let mut c = Client::connect_addr(addr, Duration::from_secs(10)).expect("connect");
    c.auth(USER, PASSWORD).expect("auth");
    c
}

fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    c.call(f, &pack_args(args), None)
        .unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// `queue.statistics('jobs')`'s task counts, as the console's table shows them.
fn counts(c: &mut Client) -> Json {
    let s = call(c, "queue.statistics", &[Value::from("jobs")]).remove(0);
    tarq_net::ctl::to_json(&s)["tasks"].clone()
}

/// The `jobs` row of the tube table the page shows now (null while it is not there).
const ROW: &str = "const rows = document.querySelectorAll('tr[data-tube=\"jobs\"]'); \
     if (rows.length !== 1) return null; const v = {}; \
     for (const s of ['ready','taken','delayed','buried','done','total']) \
     v[s] = Number(rows[0].querySelector(`td[data-status=\"${s}\"]`).textContent); return v;";

/// Two sets of one node each, both led and known to each other.
fn two_sets(etcd: &Etcd) -> Nodes {
    let flags = [
        "--http-listen",
        "127.0.0.1:0",
        "--user",
        USER,
        "--password",
        PASSWORD,
    ];
    let nodes = Nodes::start_sets(etcd, &[("a", 1), ("b", 1)], &flags);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    nodes.wait_primaries_known(&[0, 1], 2);
    nodes
}

fn web_of(nodes: &Nodes, i: usize) -> SocketAddr {
    let t = nodes.nodes[i].tarq.as_ref().unwrap();
    t.metrics.expect("the HTTP address is logged")
}

#[test]
fn the_charts_of_a_node_that_did_none_of_the_puts_show_them() {
    if !browser_present("the_charts_of_a_node_that_did_none_of_the_puts_show_them") {
        return;
    }
    let etcd = Etcd::start();
    let nodes = two_sets(&etcd);
    let mut a = client(nodes.nodes[0].addr);
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(1))]);
    let args = [Value::from("solo"), Value::from("fifottl"), opts];
    call(&mut a, "queue.create_tube", &args);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let br = Browser::start(&basic);
    // Whose set owns the one partition: the other node reads.
    br.open(&format!("http://{}/#/tube/solo", web_of(&nodes, 0)));
    let set = br.until(
        "solo's partition",
        "const r = document.querySelector('#tube-partitions tr[data-partition]'); \
         return r && r.children[2].textContent;",
    );
    let owner = usize::from(set == "b");
    let reader = web_of(&nodes, 1 - owner);
    // 40 puts a second for ten seconds, through the owner.
    let to = nodes.nodes[owner].addr;
    let puts = std::thread::spawn(move || {
        let mut c = client(to);
        let start = std::time::Instant::now();
        for k in 0..400u64 {
            let due = start + Duration::from_millis(25 * k);
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
            call(&mut c, "queue.tube.solo:put", &[Value::from(k)]);
        }
    });
    br.open(&format!("http://{reader}/"));
    br.until("the page is ready", "return document.body.dataset.ready");
    let rate = br.until(
        "solo's put rate on the node that did none of the puts",
        "const td = document.querySelector('tr[data-tube=\"solo\"] td[data-status=\"put-rate\"]'); \
         const v = td && Number(td.textContent); return v > 0 && v;",
    );
    assert!(rate.as_u64() <= Some(400), "{rate}");
    let caption = br.script(
        "const s = document.querySelector('#view-overview [data-scope]'); \
         return !s.hidden && s.dataset.scope === 'cluster' && s.textContent;",
    );
    assert!(
        caption
            .as_str()
            .is_some_and(|c| c.contains("whole cluster")),
        "{caption}"
    );
    br.screenshot(&results().join("overview-cluster-rates.png"));
    br.open(&format!("http://{reader}/#/tube/solo"));
    br.until(
        "points in solo's chart of puts",
        "const c = document.querySelector('#chart-tube-rates'); \
         const puts = state.tubeHistory ? state.tubeHistory.rates[1] : []; \
         return c.dataset.nonzero === 'true' && puts.filter((v) => v > 0).length >= 5;",
    );
    br.screenshot(&results().join("tube-cluster-rates.png"));
    puts.join().expect("the puts");
}

#[test]
fn the_console_of_either_node_shows_the_whole_sharded_cluster() {
    if !browser_present("the_console_of_either_node_shows_the_whole_sharded_cluster") {
        return;
    }
    let etcd = Etcd::start();
    let flags = [
        "--http-listen",
        "127.0.0.1:0",
        "--user",
        USER,
        "--password",
        PASSWORD,
    ];
    let nodes = Nodes::start_sets(&etcd, &[("a", 1), ("b", 1)], &flags);
    nodes.wait_leader_among(&[0]);
    nodes.wait_leader_among(&[1]);
    nodes.wait_primaries_known(&[0, 1], 2);
    let addr = |i: usize| nodes.nodes[i].addr;
    let web = |i: usize| {
        let t = nodes.nodes[i].tarq.as_ref().unwrap();
        t.metrics.expect("the HTTP address is logged")
    };
    let (mut a, mut b) = (client(addr(0)), client(addr(1)));
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(4))]);
    call(
        &mut a,
        "queue.create_tube",
        &[Value::from("jobs"), Value::from("fifottl"), opts],
    );
    // Puts through each node go to the partitions it leads; some taken, some buried.
    let mut a_ids = Vec::new();
    for n in 0..40 {
        let t = call(
            &mut a,
            "queue.tube.jobs:put",
            &[Value::from(format!("a{n}"))],
        );
        a_ids.push(t[0].as_array().unwrap()[0].as_u64().unwrap());
    }
    for n in 0..30 {
        call(
            &mut b,
            "queue.tube.jobs:put",
            &[Value::from(format!("b{n}"))],
        );
    }
    let mut holder = client(addr(1));
    for _ in 0..3 {
        call(&mut holder, "queue.tube.jobs:take", &[Value::from(0)]);
    }
    let taken = call(&mut b, "queue.tube.jobs:take", &[Value::from(0)]);
    let id = taken[0].as_array().unwrap()[0].clone();
    call(&mut b, "queue.tube.jobs:bury", &[id]);
    let want = counts(&mut a);
    assert_eq!(want, counts(&mut b), "queue.statistics from either node");
    assert_eq!(want["total"], 70, "{want}");

    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let br = Browser::start(&basic);
    for (i, name) in [(0, "a"), (1, "b")] {
        br.open(&format!("http://{}/", web(i)));
        br.until("the page is ready", "return document.body.dataset.ready");
        br.until(&format!("node {name}'s row of the whole tube"), ROW);
        // The console's figures are at most a second old: the row settles on the exact ones.
        let mut row = Json::Null;
        wait_for(
            &format!("node {name}'s row to equal queue.statistics"),
            || {
                row = br.script(ROW);
                row == want
            },
        );
        assert_eq!(row, want, "node {name}'s table against queue.statistics");
        br.screenshot(&results().join(format!("overview-{name}.png")));
    }

    // The tube's page on node b: its four partitions, their sets, counts adding up.
    br.open(&format!("http://{}/#/tube/jobs", web(1)));
    let parts = br.until(
        "the partitions table",
        "const rows = document.querySelectorAll('#tube-partitions tr[data-partition]'); \
         if (rows.length !== 4) return null; \
         return [...rows].map((r) => [...r.children].map((td) => td.textContent));",
    );
    let parts = parts.as_array().unwrap();
    let sets: Vec<&str> = parts.iter().map(|r| r[2].as_str().unwrap()).collect();
    assert!(sets.contains(&"a") && sets.contains(&"b"), "{parts:?}");
    let total: u64 = parts
        .iter()
        .map(|r| r[8].as_str().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        total, 70,
        "the partitions' totals add up to the tube's: {parts:?}"
    );
    br.screenshot(&results().join("tube-partitions.png"));

    // Its task list, on node b: the whole tube's ready tasks, each once with its partition,
    // of both sets' partitions; "More" goes on across the partitions.
    let set_of = |p: &str| {
        let row = parts.iter().find(|r| r[0] == p);
        row.map(|r| r[2].as_str().unwrap().to_owned())
    };
    let ready = want["ready"].as_u64().unwrap();
    assert!(ready > 50, "more than a page: {want}");
    br.until(
        "the first page of tasks",
        "return document.querySelectorAll('#tasks tbody tr[data-partition]').length === 50",
    );
    // "More", clicked again should the page's own refresh have shown the first page anew
    // meanwhile (at most once a second and a half, so a page is never asked twice).
    let listed = br.until(
        "every ready task listed",
        &format!(
            "const rows = document.querySelectorAll('#tasks tbody tr[data-partition]'); \
             if (rows.length === 50 && Date.now() - (window.moreAt || 0) > 1500) {{ \
               window.moreAt = Date.now(); document.querySelector('#more').click(); }} \
             if (rows.length !== {ready}) return null; \
             return [...rows].map((r) => [r.dataset.task, r.dataset.partition, \
               r.querySelector('td[data-col=\"partition\"]').textContent]);"
        ),
    );
    let listed = listed.as_array().unwrap();
    let ids: std::collections::HashSet<&str> =
        listed.iter().map(|r| r[0].as_str().unwrap()).collect();
    assert_eq!(ids.len() as u64, ready, "each task once: {listed:?}");
    let sets: std::collections::HashSet<String> = listed
        .iter()
        .map(|r| {
            assert_eq!(r[1], r[2], "the partition shown is the row's: {r:?}");
            set_of(r[1].as_str().unwrap()).unwrap_or_else(|| panic!("no partition {r:?}"))
        })
        .collect();
    assert_eq!(sets.len(), 2, "tasks of both sets' partitions: {sets:?}");
    let shown = br.script(
        "return getComputedStyle(document.querySelector('#tasks th[data-col=\"partition\"]')).display",
    );
    assert_ne!(shown, "none", "the partition column is shown");
    br.screenshot(&results().join("tube-tasks.png"));

    // A task of set a's partition, found by id from node b's console, and buried from there.
    let number = a_ids[0];
    br.script(&format!(
        "document.querySelector('#find input').value = '{number}'; \
         document.querySelector('#find').requestSubmit(); return true;"
    ));
    // The found task alone (the list showed it already, among the others).
    br.until(
        "the task found by id",
        &format!(
            "const rows = document.querySelectorAll('#tasks tbody tr'); \
             return rows.length === 1 && rows[0].dataset.task === '{number}';"
        ),
    );
    // Clicked in the page: the page's refresh may draw the row anew between a WebDriver
    // lookup and its click.
    br.script(&format!(
        "document.querySelector('#tasks tr[data-task=\"{number}\"] button').click(); return true;"
    ));
    wait_for("the task buried through node b's console", || {
        let s = call(&mut a, "queue.tube.jobs:peek", &[Value::from(number)]);
        s[0].as_array().unwrap()[1] == Value::from("!")
    });
    br.screenshot(&results().join("tube-found-by-id.png"));

    // The cluster page: both sets with their primaries, the members, the placement.
    br.open(&format!("http://{}/#/cluster", web(0)));
    let sets = br.until(
        "both sets on the cluster page",
        "const rows = document.querySelectorAll('#cluster tr[data-set]'); \
         return rows.length === 2 && [...rows].map((r) => [r.dataset.set, r.children[1].textContent]);",
    );
    for (i, name) in [(0, "a"), (1, "b")] {
        let s = sets
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[0] == name)
            .unwrap_or_else(|| panic!("no set {name}: {sets}"));
        let primary = s[1].as_str().unwrap();
        assert!(
            primary.contains(&addr(i).to_string()),
            "set {name}'s primary {primary}"
        );
        assert_eq!(str_field(&nodes.overview(i).unwrap(), "replica_set"), name);
    }
    let placed = br.until(
        "the placement",
        "const rows = document.querySelectorAll('#cluster tr[data-placed=\"jobs\"]'); \
         return rows.length === 4 && rows.length;",
    );
    assert_eq!(placed, 4);
    let members = br.script("return document.querySelectorAll('#cluster tr[data-member]').length");
    assert_eq!(members, 2);
    br.screenshot(&results().join("cluster.png"));

    // A partition of set a's moved to b by a's primary: node b's cluster page shows its link
    // to a, up, and the move's record among set a's.
    let part = parts
        .iter()
        .find(|r| r[2] == "a")
        .map(|r| r[0].as_str().unwrap().parse::<u64>().unwrap())
        .expect("a partition of set a");
    let args = [Value::from("jobs"), Value::from(part), Value::from("b")];
    wait_for("the move to be taken and done", || {
        match a.call(
            "tarq.move",
            &pack_args(&args),
            Some(Duration::from_secs(30)),
        ) {
            Ok(_) => true,
            Err(tarq_client::ClientError::Server { message, .. })
                if message.contains("stale") || message.contains("has just moved") =>
            {
                false
            }
            Err(e) => panic!("tarq.move: {e}"),
        }
    });
    br.open(&format!("http://{}/#/cluster", web(1)));
    let link = br.until(
        "node b's link to set a",
        "const r = document.querySelector('#cluster tr[data-link=\"a\"]'); \
         return r && [...r.children].map((td) => td.textContent);",
    );
    assert_eq!(link[0], "a", "{link}");
    assert_eq!(link[1], addr(0).to_string(), "{link}");
    assert_eq!(link[2], "up", "{link}");
    let moved = br.until(
        "set a's move on node b's cluster page",
        "const r = document.querySelector('#cluster tr[data-move-set=\"a\"]'); \
         return r && r.children[2].textContent === '1' && [...r.children].map((td) => td.textContent);",
    );
    assert_eq!(moved[1], "", "no move in flight any more: {moved}");
    assert_ne!(moved[4], "0", "tasks moved: {moved}");
    br.screenshot(&results().join("cluster-links-moves.png"));
}
