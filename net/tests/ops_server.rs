//! Operating a running `tarq` binary: Graphite lines received by plain TCP and UDP listeners,
//! the Prometheus page checked by `promtool`, `tarq ctl` and its console end to end, and the
//! signals — SIGTERM/SIGINT stop gracefully with exit 0, SIGHUP reloads the log level and the
//! Graphite target. (A real carbon-cache receiver is in `ops_carbon.rs`.)

mod support;

use std::io::Write;
use std::net::{TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use rmpv::Value;
use support::*;

/// Fast pushes so the tests take milliseconds, not seconds.
const FAST: &str = "0.05";

#[test]
fn graphite_over_tcp_gets_every_figure_from_a_running_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = format!("tcp://{}", listener.local_addr().unwrap());
    let rx = collect_tcp_lines(listener);
    let t = Tarq::start(&["--graphite", &target, "--graphite-interval", FAST]);

    let mut c = Client::connect(t.addr);
    for data in ["a", "b"] {
        c.call("queue.put", &[Value::from(data)]).one();
    }
    let task = c.call("queue.take", &[]).one();
    c.call("queue.ack", &[Value::from(id_of(&task))]).one();

    // The same names as queue.stats(), every one of them.
    let stats = c.call("queue.stats", &[]).one();
    let names: Vec<String> = stats
        .as_map()
        .unwrap()
        .iter()
        .map(|(k, _)| k.as_str().unwrap().to_string())
        .collect();
    assert!(names.len() >= 19, "{names:?}");
    // A tube of the tarantool/queue API, with a dot in its name (a Graphite level separator).
    c.call(
        "queue.create_tube",
        &[Value::from("mail.out"), Value::from("fifo")],
    )
    .one();
    c.call("queue.tube.mail.out:put", &[Value::from("m")]).one();
    // The server-wide figures are queue.stats()'s: every tube's, `default` and `mail.out`.
    let seen = wait_for_figures(&rx, "every figure, with puts=3 acks=1 total=2", |s| {
        s.get("puts") == Some(&3)
            && s.get("acks") == Some(&1)
            && s.get("total") == Some(&2)
            && names.iter().all(|n| s.contains_key(n))
            // Per tube: queue.stats.<tube>.<name>, the seed's calls counted on `default`.
            && [
                ("default.puts", 2),
                ("default.acks", 1),
                ("default.total", 1),
                ("mail_out.puts", 1),
                ("mail_out.ready", 1),
                ("mail_out.taken", 0),
            ]
            .iter()
            .all(|(k, v)| s.get(*k) == Some(v))
    });
    assert_eq!(seen["ready"], 2);
    assert_eq!(seen["connections"], 1);
}

#[test]
fn graphite_over_udp_gets_the_same_lines() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = format!("udp://{}", socket.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    let reader = socket.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = reader.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(
                text.ends_with('\n'),
                "a datagram holds whole lines: {text:?}"
            );
            for line in text.lines() {
                if tx.send(line.to_string()).is_err() {
                    return;
                }
            }
        }
    });
    let t = Tarq::start(&["--graphite", &target, "--graphite-interval", FAST]);
    let mut c = Client::connect(t.addr);
    c.call(
        "queue.put",
        &[
            Value::from("x"),
            support::map(&[("delay", Value::from(60))]),
        ],
    )
    .one();
    // A sample may span datagrams: wait for both figures.
    wait_for_figures(&rx, "waiting=1 and puts=1", |s| {
        s.get("waiting") == Some(&1) && s.get("puts") == Some(&1)
    });
}

#[test]
fn an_absent_graphite_never_stalls_serving() {
    // Nobody listens there: every connect is refused and retried with backoff.
    let absent = Refusing::open();
    let target = format!("tcp://{}", absent.addr);
    let mut t = Tarq::start(&["--graphite", &target, "--graphite-interval", "0.01"]);
    let mut c = Client::connect(t.addr);
    let started = Instant::now();
    for i in 0..300u64 {
        c.call("queue.put", &[Value::from(i)]).one();
        let task = c.call("queue.take", &[]).one();
        c.call("queue.ack", &[Value::from(id_of(&task))]).one();
    }
    assert!(
        started.elapsed() < WAIT,
        "900 calls took {:?}",
        started.elapsed()
    );
    let warned = t.wait_for_line("graphite: cannot connect");
    assert!(warned.contains(&target), "{warned}");
    // One warning for the outage, not one per retry.
    let n = t
        .log()
        .iter()
        .filter(|l| l.contains("graphite: cannot connect"))
        .count();
    assert_eq!(n, 1, "{:?}", t.log());
}

#[test]
fn the_metrics_page_passes_promtool_and_counts_requests() {
    let t = Tarq::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = t.metrics.expect("the metrics address is logged");
    let mut c = Client::connect(t.addr);
    c.call("queue.put", &[Value::from("x")]).one();
    let task = c.call("queue.take", &[]).one();
    c.call("queue.release", &[Value::from(id_of(&task))]).one();
    c.call(
        "queue.create_tube",
        &[Value::from("say \"hi\""), Value::from("fifo")],
    )
    .one();
    // 32 requests in all: every one counted, one in 16 timed.
    for _ in 0..28 {
        assert_eq!(c.ping().code, 0);
    }

    let (status, page) = http_get(metrics, "/metrics");
    assert_eq!(status, 200, "{page}");
    for line in [
        "# TYPE tarq_puts_total counter\ntarq_puts_total 1\n",
        "# TYPE tarq_releases_total counter\ntarq_releases_total 1\n",
        "# TYPE tarq_ready gauge\ntarq_ready 1\n",
        "# TYPE tarq_connections gauge\ntarq_connections 1\n",
        "# TYPE tarq_request_duration_seconds histogram\n",
        "# TYPE tarq_requests_total counter\ntarq_requests_total 32\n",
        "tarq_request_duration_seconds_bucket{le=\"+Inf\"} 2\n",
        "tarq_request_duration_seconds_count 2\n",
        // Per tube, one family per figure, a sample per tube (the label escaped).
        "# TYPE tarq_tube_ready gauge\ntarq_tube_ready{tube=\"default\"} 1\n\
         tarq_tube_ready{tube=\"say \\\"hi\\\"\"} 0\n",
        "# TYPE tarq_tube_releases_total counter\ntarq_tube_releases_total{tube=\"default\"} 1\n",
    ] {
        assert!(page.contains(line), "{line:?} not in:\n{page}");
    }

    let promtool = prerequisite("promtool (Debian package prometheus)", tool("promtool"));
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\npage:\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_metrics_handler_refuses_what_it_does_not_serve() {
    let t = Tarq::start(&["--metrics-listen", "127.0.0.1:0"]);
    let metrics = t.metrics.unwrap();
    assert_eq!(http_get(metrics, "/nope").0, 404);
    assert_eq!(http_raw(metrics, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    let huge = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "y".repeat(20_000));
    assert_eq!(http_raw(metrics, huge.as_bytes()).0, 431);
    // Still serving both ports afterwards.
    assert_eq!(http_get(metrics, "/metrics").0, 200);
    assert_eq!(Client::connect(t.addr).ping().code, 0);
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "ctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn ctl_commands_print_json() {
    let t = Tarq::start(&[]);
    let put = json(&t.ctl(&["put", r#"{"job":7}"#, "--pri", "-1"]));
    assert_eq!(put["id"], 1);
    assert_eq!(put["status"], "R");
    assert_eq!(put["data"], serde_json::json!({"job": 7}));
    assert_eq!(put["pri"], -1);

    let delayed = json(&t.ctl(&["put", "plain text", "--delay", "60", "--ttl", "120"]));
    assert_eq!(delayed["status"], "W");
    assert_eq!(delayed["data"], "plain text");
    assert!(delayed["runat"].as_f64().unwrap() > 0.0);

    let taken = json(&t.ctl(&["take"]));
    assert_eq!(
        (taken["id"].as_u64(), taken["status"].as_str()),
        (Some(1), Some("T"))
    );

    // ctl's connection closed, so the task is ready again; nothing else is ready.
    let stats = json(&t.ctl(&["stats"]));
    assert_eq!(stats["total"], 2);
    assert_eq!(stats["ready"], 1);
    assert_eq!(stats["waiting"], 1);
    assert_eq!(stats["auto_released"], 1);

    // A task someone else holds: ack and release from ctl are refused, by name.
    let mut holder = Client::connect(t.addr);
    let held = holder.call("queue.take", &[]).one();
    assert_eq!(id_of(&held), 1);
    let empty = json(&t.ctl(&["take", "--timeout", "0.05"]));
    assert!(empty.is_null(), "{empty}");
    for args in [["ack", "1"], ["release", "1"]] {
        let out = t.ctl(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("Task 1 taken by"), "{args:?}: {err}");
    }
    let out = t.ctl(&["ack", "999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Task {999} was not found"));

    holder.call("queue.ack", &[Value::from(1)]).one();
    assert_eq!(json(&t.ctl(&["stats"]))["acks"], 1);
}

#[test]
fn ctl_works_on_tubes() {
    let t = Tarq::start(&[]);
    let tube = json(&t.ctl(&[
        "create-tube",
        "jobs",
        "fifottl",
        "--ttl",
        "60",
        "--if-not-exists",
    ]));
    assert_eq!(
        (tube["name"].as_str(), tube["type"].as_str()),
        (Some("jobs"), Some("fifottl"))
    );
    assert_eq!(tube["opts"]["ttl"], 60.0);
    let put = json(&t.ctl(&["--tube", "jobs", "put", r#"{"job":7}"#, "--pri", "2"]));
    // A tube numbers its own tasks from 0.
    assert_eq!(put, serde_json::json!([0, "r", {"job": 7}]));
    let buried = json(&t.ctl(&["--tube", "jobs", "bury", "0"]));
    assert_eq!(buried[1], "!");
    assert_eq!(json(&t.ctl(&["--tube", "jobs", "peek", "0"]))[1], "!");
    assert_eq!(json(&t.ctl(&["--tube", "jobs", "kick", "5"])), 1);
    let taken = json(&t.ctl(&["--tube", "jobs", "take"]));
    assert_eq!((taken[0].as_u64(), taken[1].as_str()), (Some(0), Some("t")));
    let stats = json(&t.ctl(&["--tube", "jobs", "stats"]));
    assert_eq!(stats["calls"]["kick"], 1);
    assert_eq!(
        stats["tasks"]["ready"], 1,
        "released when ctl's connection closed: {stats}"
    );
    // Peek, bury and kick need a tube, and say so.
    let out = t.ctl(&["peek", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --tube NAME"));
    assert_eq!(json(&t.ctl(&["drop-tube", "jobs"])), true);
    let out = t.ctl(&["--tube", "jobs", "peek", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tube 'jobs' does not exist"), "{err}");
}

#[test]
fn ctl_lists_tubes_deletes_touches_and_sets_a_dedup_window() {
    let t = Tarq::start(&[]);
    assert_eq!(json(&t.ctl(&["list-tubes"])), serde_json::json!([]));
    let tube = json(&t.ctl(&["create-tube", "work", "fifottl", "--dedup-window", "60"]));
    assert_eq!(tube["opts"]["dedup_window"], 60.0);
    json(&t.ctl(&["create-tube", "ab", "utube"]));
    assert_eq!(
        json(&t.ctl(&["list-tubes"])),
        serde_json::json!(["ab", "work"])
    );

    let put = json(&t.ctl(&["--tube", "work", "put", "a", "--ttl", "60"]));
    let id = put[0].as_u64().unwrap().to_string();
    // Only the connection that took a task may touch it, as the original says; a delta
    // of 0 or less (a negative number is a value) changes nothing and answers nothing.
    assert_eq!(
        json(&t.ctl(&["--tube", "work", "touch", &id, "-5"])),
        serde_json::Value::Null
    );
    let out = t.ctl(&["--tube", "work", "touch", &id, "5"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("Task was not taken"),
        "{err}"
    );
    let deleted = json(&t.ctl(&["--tube", "work", "delete", &id]));
    assert_eq!(deleted, serde_json::json!([put[0], "-", "a"]));
    let out = t.ctl(&["--tube", "work", "delete", &id]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("Task {id} not found")), "{err}");

    // Without --tube, on the seed's queue.
    let seed = json(&t.ctl(&["put", "s"]));
    let id = seed["id"].as_u64().unwrap().to_string();
    assert_eq!(json(&t.ctl(&["delete", &id]))[1], "-");
    assert_eq!(json(&t.ctl(&["stats"]))["total"], 0);

    let out = Command::new(BIN)
        .args(["ctl", "--version"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("tarq-ctl {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn ctl_names_an_unreachable_server() {
    let absent = Refusing::open();
    let addr = absent.addr.to_string();
    let out = Command::new(BIN)
        .args(["ctl", "--addr", &addr, "--timeout", "2", "stats"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot connect to {addr}")), "{err}");
}

#[test]
fn the_console_sends_each_line_as_a_call() {
    let t = Tarq::start(&[]);
    let mut child = Command::new(BIN)
        .args(["ctl", "--addr", &t.addr.to_string(), "console", "--history"])
        .arg(t.path("history"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"queue.put({job='x', n={1,2}}, {pri=3})\n\
              queue.take()\n\
              queue.ack(1)\n\
              queue.take(0.05)\n\
              queue.put('oops'\n\
              queue.nothing()\n\
              return queue.stats()\n\
              quit\n\
              queue.put('after quit')\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // Error lines start at column 0 with "error:"; everything else is pretty JSON.
    let (errors, json_lines): (Vec<&str>, Vec<&str>) =
        text.lines().partition(|l| l.starts_with("error:"));
    let docs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&json_lines.join("\n"))
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("bad console output ({e}):\n{text}"));
    let task = serde_json::json!({"job": "x", "n": [1, 2]});
    assert_eq!(docs.len(), 5, "{docs:?} {errors:?}");
    assert_eq!(docs[0][0]["data"], task);
    assert_eq!(docs[0][0]["pri"], 3);
    assert_eq!(docs[1][0]["status"], "T");
    assert_eq!(docs[2][0]["id"], 1);
    assert_eq!(docs[3], serde_json::json!([]), "nothing left to take");
    assert_eq!(docs[4][0]["acks"], 1);
    assert_eq!(docs[4][0]["total"], 0, "the line after quit was not run");
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].contains("at column 17: expected ',' or ')'"),
        "{}",
        errors[0]
    );
    assert!(
        errors[1].contains("Procedure 'queue.nothing' is not defined"),
        "{}",
        errors[1]
    );
}

/// Waits for a take parked on `c` to be registered server-side (stats show it).
fn wait_parked(t: &Tarq, n: u64) {
    let mut probe = Client::connect(t.addr);
    support::wait_until("the take to park", || {
        field(&probe.call("queue.stats", &[]).one(), "parked_takes").as_u64() == Some(n)
    });
}

#[test]
fn sigterm_answers_parked_takes_and_exits_0() {
    let mut t = Tarq::start(&[]);
    let mut c = Client::connect(t.addr);
    let sync = c.send_call("queue.take", &[Value::from(60)]);
    wait_parked(&t, 1);
    t.signal("TERM");
    // The take in flight gets its answer (no task) before the connection goes.
    let reply = c.recv();
    assert_eq!((reply.sync, reply.code), (sync, 0));
    assert_eq!(reply.ok(), Vec::<Value>::new());
    let status = t.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    t.wait_for_line("stopping signal=\"SIGTERM\"");
    t.wait_for_line("tarq stopped");
}

#[test]
fn sigint_stops_with_exit_0() {
    let mut t = Tarq::start(&[]);
    assert_eq!(Client::connect(t.addr).ping().code, 0);
    t.signal("INT");
    let status = t.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    t.wait_for_line("stopping signal=\"SIGINT\"");
}

#[test]
fn sighup_changes_the_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tarq.toml");
    std::fs::write(&cfg, "log-level = \"info\"\n").unwrap();
    let mut t = Tarq::start_in(dir, &["--config", cfg.to_str().unwrap()]);
    Client::connect(t.addr).ping();
    t.wait_for_line("connection opened");

    // Quieter: connections are no longer logged.
    std::fs::write(&cfg, "log-level = \"warn\"\n").unwrap();
    t.signal("HUP");
    let reloaded = t.wait_for_line("log-level: \"info\" -> \"warn\"");
    let mark = t.log().len();
    assert!(reloaded.contains("configuration reloaded"), "{reloaded}");
    let mut quiet = Client::connect(t.addr);
    quiet.ping();
    drop(quiet);
    // Back to info: the reload line is the marker that everything before it was logged.
    std::fs::write(&cfg, "log-level = \"info\"\n").unwrap();
    t.signal("HUP");
    t.wait_for_line_after(mark, "log-level: \"warn\" -> \"info\"");
    let between = &t.log()[mark..];
    assert!(
        !between.iter().any(|l| l.contains("connection opened")),
        "at warn, connections are not logged: {between:?}"
    );
    let mark = t.log().len();
    Client::connect(t.addr).ping();
    t.wait_for_line_after(mark, "connection opened");
}

#[test]
fn sighup_moves_the_graphite_push_and_names_what_needs_a_restart() {
    let first = TcpListener::bind("127.0.0.1:0").unwrap();
    let second = TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, b) = (first.local_addr().unwrap(), second.local_addr().unwrap());
    let (rx_a, rx_b) = (collect_tcp_lines(first), collect_tcp_lines(second));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tarq.toml");
    std::fs::write(
        &cfg,
        format!("graphite = \"tcp://{a}\"\ngraphite-interval = {FAST}\n"),
    )
    .unwrap();
    let mut t = Tarq::start_in(dir, &["--config", cfg.to_str().unwrap()]);
    wait_for_figures(&rx_a, "lines at the first target", |s| {
        s.contains_key("total")
    });

    std::fs::write(
        &cfg,
        format!(
            "graphite = \"tcp://{b}\"\ngraphite-interval = {FAST}\nmax-connections = 7\n\
             metrics-listen = \"127.0.0.1:1\"\n"
        ),
    )
    .unwrap();
    t.signal("HUP");
    let line = t.wait_for_line("configuration reloaded");
    assert!(
        line.contains(&format!("graphite: tcp://{a} -> tcp://{b}")),
        "{line}"
    );
    assert!(line.contains("max-connections: 1000 -> 7"), "{line}");
    let kept = t.wait_for_line("configuration reloaded in part");
    assert!(
        kept.contains("http-listen stays None until a restart"),
        "{kept}"
    );
    let mut c = Client::connect(t.addr);
    c.call("queue.put", &[Value::from("x")]).one();
    wait_for_figures(&rx_b, "puts=1 at the second target", |s| {
        s.get("puts") == Some(&1)
    });
    // The first target hears no more: its connection was closed.
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx_a.recv_timeout(left) {
            Ok(line) if line == CLOSED => break,
            Ok(_) => {}
            Err(_) => panic!("the first target's connection stayed open"),
        }
    }
}

#[test]
fn sighup_with_a_broken_config_keeps_the_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tarq.toml");
    std::fs::write(&cfg, "max-connections = 5\n").unwrap();
    let mut t = Tarq::start_in(dir, &["--config", cfg.to_str().unwrap()]);
    std::fs::write(&cfg, "max-connections = \"lots\"\n").unwrap();
    t.signal("HUP");
    let line = t.wait_for_line("configuration not reloaded");
    // One line, naming the setting and what is wrong with it.
    assert!(
        line.contains("max-connections") && line.contains("invalid type"),
        "{line}"
    );
    assert_eq!(Client::connect(t.addr).ping().code, 0);
}

#[test]
fn help_documents_the_ops_flags_and_ctl_commands() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--graphite ",
        "--graphite-interval",
        "--metrics-listen",
        "ctl",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    let out = Command::new(BIN).args(["ctl", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for word in [
        "put",
        "take",
        "ack",
        "release",
        "stats",
        "console",
        "list-tubes",
        "delete",
        "touch",
        "--version",
        "--addr",
        "127.0.0.1:3301",
    ] {
        assert!(help.contains(word), "ctl --help lacks {word}:\n{help}");
    }
}

#[test]
fn sighup_applies_a_new_connection_limit_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("tarq.toml");
    std::fs::write(&cfg, "max-connections = 10\n").unwrap();
    let mut t = Tarq::start_in(dir, &["--config", cfg.to_str().unwrap()]);
    let mut first = Client::connect(t.addr);
    assert_eq!(first.ping().code, 0);
    std::fs::write(&cfg, "max-connections = 1\n").unwrap();
    t.signal("HUP");
    t.wait_for_line("max-connections: 10 -> 1");
    // The second connection gets the greeting, then the limit's error, then the close.
    let mut second = Client::connect(t.addr);
    let replies = second.expect_closed();
    assert_eq!(replies.len(), 1, "{replies:?}");
    let msg = replies[0].error.clone().unwrap_or_default();
    assert!(msg.contains("the limit is 1"), "{msg}");
    assert_eq!(first.ping().code, 0, "the first connection is not affected");
}

/// Issue 39: `tarq ctl stats`, `/metrics` `tarq_tasks` and `/api/server` said total 0 while
/// the tubes held thousands of tasks: the headlines were the tube `default`'s. They count
/// every tube now, and a dropped tube's operations stay counted (counters never go down).
#[test]
fn headline_figures_count_every_tube_and_counters_survive_a_drop() {
    let t = Tarq::start(&["--http-listen", "127.0.0.1:0"]);
    let http = t.metrics.expect("the HTTP address is logged");
    let mut c = Client::connect(t.addr);
    c.call("queue.put", &[Value::from("seed")]).one();
    for tube in ["jobs", "mail"] {
        c.call(
            "queue.create_tube",
            &[Value::from(tube), Value::from("fifottl")],
        )
        .one();
        for n in 0..3 {
            c.call(&format!("queue.tube.{tube}:put"), &[Value::from(n)])
                .one();
        }
    }
    let task = c.call("queue.tube.mail:take", &[Value::from(0)]).one();
    let id = task.as_array().unwrap()[0].clone();
    c.call("queue.tube.mail:ack", &[id]).one();

    let figures = |c: &mut Client| {
        let stats = json(&t.ctl(&["stats"]));
        let queue = tarq_net::ctl::to_json(&c.call("queue.stats", &[]).one());
        let (_, page) = http_get(http, "/metrics");
        let metric = |name: &str| -> u64 {
            let line = page
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .unwrap_or_else(|| panic!("no {name} in:\n{page}"));
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        let (_, server) = http_get(http, "/api/server");
        let server: serde_json::Value = serde_json::from_str(&server).unwrap();
        let api = &server["figures"];
        for (name, prom) in [
            ("total", "tarq_tasks"),
            ("ready", "tarq_ready"),
            ("puts", "tarq_puts_total"),
            ("acks", "tarq_acks_total"),
        ] {
            assert_eq!(stats[name], queue[name], "{name}: ctl prints queue.stats()");
            assert_eq!(stats[name].as_u64(), Some(metric(prom)), "{name}");
            assert_eq!(stats[name], api[name], "{name} in /api/server");
        }
        stats
    };
    let before = figures(&mut c);
    assert_eq!(
        (
            &before["total"],
            &before["ready"],
            &before["puts"],
            &before["acks"]
        ),
        (&6.into(), &6.into(), &7.into(), &1.into())
    );

    c.call("queue.tube.jobs:truncate", &[]).ok();
    c.call("queue.tube.jobs:drop", &[]).ok();
    let after = figures(&mut c);
    assert_eq!(
        (&after["total"], &after["puts"], &after["acks"]),
        (&3.into(), &7.into(), &1.into()),
        "jobs' tasks are gone, its puts still counted"
    );
}
