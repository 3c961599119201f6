//! TLS on the client ports, through real clients: the PyPI `tarantool` connector with
//! `transport='ssl'` on the IPROTO port (required: a plain client is refused at once; optional:
//! both are served), `openssl s_client` reading the served chain, curl with `--cacert` on the
//! HTTP API (and a plain request answered 400), Python's ssl module on the beanstalk port, and a
//! certificate replaced on disk and reloaded with SIGHUP while a TLS connection stays open.
//! Certificates are made per test with the openssl command line: a root CA, an intermediate CA
//! and node certificates signed by it for 127.0.0.1.

#[path = "support/beanstalk.rs"]
mod beanstalk;
#[path = "support/pki.rs"]
mod pki;
mod support;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pki::Pki;
use support::*;

/// A tarq serving with `tls` over the certificate `node`.
fn start(node: &(PathBuf, PathBuf), tls: &[&str]) -> Tarq {
    let mut args = vec![
        "--tls-cert",
        node.0.to_str().unwrap(),
        "--tls-key",
        node.1.to_str().unwrap(),
    ];
    args.extend_from_slice(tls);
    Tarq::start(&args)
}

fn python_tarantool() {
    require_command(
        "the PyPI `tarantool` connector",
        &["python3", "-c", "import tarantool"],
    );
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients/tls")
        .join(name)
}

/// Runs the connector's TLS flow against `port` in `mode` and fails with its output.
fn flow(server: &mut Tarq, ca: &Path, mode: &str) {
    let mut cmd = Command::new("python3");
    cmd.arg(script("flow.py"))
        .arg(server.addr.port().to_string())
        .arg(ca)
        .arg(mode);
    let run = run_with_deadline(cmd, WAIT);
    if !run.stdout.contains("OK: tls flow") {
        server.lines.drain(std::time::Duration::from_millis(50));
        panic!(
            "the TLS flow failed ({:?})\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- server ---\n{}",
            run.status,
            run.stdout,
            run.stderr,
            server.log().join("\n")
        );
    }
    print!("{}", run.stdout);
}

#[test]
fn the_python_connector_puts_and_takes_over_tls_and_a_plain_client_is_refused_at_once() {
    python_tarantool();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node-a");
    let mut server = start(&node, &["--listen-tls", "required"]);
    flow(&mut server, &pki.ca(), "required");
    server.wait_for_line("plain connection refused: the port requires TLS");
}

#[test]
fn an_optional_iproto_port_serves_tls_and_plain_clients() {
    python_tarantool();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node-a");
    let mut server = start(&node, &["--listen-tls", "optional"]);
    flow(&mut server, &pki.ca(), "optional");
}

#[test]
fn openssl_s_client_sees_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node-a");
    let server = start(&node, &["--listen-tls", "required"]);
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-showcerts", "-verify_return_error", "-connect"])
        .arg(server.addr.to_string())
        .arg("-CAfile")
        .arg(pki.ca());
    let run = run_with_deadline(cmd, WAIT);
    let out = format!("{}{}", run.stdout, run.stderr);
    for want in [
        "depth=2 CN = tarq test root",
        "depth=1 CN = intermediate",
        "depth=0 CN = node-a",
        " 0 s:CN = node-a",
        " 1 s:CN = intermediate",
        "Verify return code: 0 (ok)",
    ] {
        assert!(
            out.contains(want),
            "{want:?} missing from s_client's output:\n{out}"
        );
    }
}

#[test]
fn curl_with_the_ca_uses_the_http_api_and_plain_http_is_told_to_use_https() {
    let curl = prerequisite("curl", tool("curl"));
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node-a");
    let mut server = start(
        &node,
        &[
            "--http-listen",
            "127.0.0.1:0",
            "--http-tls",
            "required",
            "--user",
            "admin",
            "--password",
            "secret",
        ],
    );
    let line = server.wait_for_line("serving the web console");
    let http = addr_in(&line, "listen=").expect("the line names the address");
    let curl = |url: String, extra: &[&str]| {
        let mut cmd = Command::new(&curl);
        cmd.args(["-sS", "-u", "admin:secret", "--cacert"])
            .arg(pki.ca())
            .args(extra)
            .arg(url);
        run_with_deadline(cmd, WAIT)
    };
    let put = curl(
        format!("https://{http}/api/tubes/default/tasks"),
        &[
            "-X",
            "POST",
            "-H",
            "content-type: application/json",
            "-d",
            r#"{"data":"via https"}"#,
        ],
    );
    assert!(
        put.stdout.contains("via https"),
        "{} {}",
        put.stdout,
        put.stderr
    );
    let listed = curl(format!("https://{http}/api/tubes"), &[]);
    assert!(listed.stdout.contains("\"default\""), "{}", listed.stdout);
    let plain = curl(format!("http://{http}/api/tubes"), &["-w", "%{http_code}"]);
    assert!(
        plain.stdout.contains("requires TLS") && plain.stdout.ends_with("400"),
        "{} {}",
        plain.stdout,
        plain.stderr
    );
}

#[test]
fn the_beanstalk_port_speaks_tls_and_optional_keeps_plain_clients() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let node = pki.node("node-a");
    let (mut server, addr) = beanstalk::start(&[
        "--tls-cert",
        node.0.to_str().unwrap(),
        "--tls-key",
        node.1.to_str().unwrap(),
        "--beanstalk-tls",
        "optional",
    ]);
    // Python's own ssl module, as a beanstalk client over TLS would use it.
    let code = r#"
import socket, ssl, sys
ctx = ssl.create_default_context(cafile=sys.argv[2])
with socket.create_connection(("127.0.0.1", int(sys.argv[1]))) as raw:
    with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"put 0 0 60 5\r\nhello\r\nreserve-with-timeout 0\r\n")
        got = b""
        while got.count(b"\r\n") < 3:
            got += s.recv(4096)
        print(got.decode().replace("\r\n", "|"))
"#;
    let mut cmd = Command::new("python3");
    cmd.args(["-c", code])
        .arg(addr.port().to_string())
        .arg(pki.ca());
    let run = run_with_deadline(cmd, WAIT);
    assert!(
        run.stdout.starts_with("INSERTED ")
            && run.stdout.contains("|RESERVED ")
            && run.stdout.contains("|hello|"),
        "{} {}",
        run.stdout,
        run.stderr
    );
    let mut plain = beanstalk::Bs::connect(addr);
    let id = plain.put(0, b"in the clear");
    assert!(id > 0);
    server.wait_for_line("connection opened");
}

#[test]
fn sighup_serves_a_replaced_certificate_to_new_connections_and_old_ones_go_on() {
    python_tarantool();
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let a = pki.node("node-a");
    let b = pki.node("node-b");
    // The server reads these two paths; the test replaces their contents.
    let served = (
        dir.path().join("served.chain"),
        dir.path().join("served.key"),
    );
    std::fs::copy(&a.0, &served.0).unwrap();
    std::fs::copy(&a.1, &served.1).unwrap();
    let mut server = start(&served, &["--listen-tls", "required"]);
    let mut client = Proc::spawn(
        Command::new("python3")
            .arg(script("reload.py"))
            .arg(server.addr.port().to_string())
            .arg(pki.ca())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    );
    let mut stdin = client.0.stdin.take().unwrap();
    let mut out = Lines::read(client.0.stdout.take().unwrap());
    out.wait_for("first node-a", WAIT);
    std::fs::copy(&b.0, &served.0).unwrap();
    std::fs::copy(&b.1, &served.1).unwrap();
    let from = server.log().len();
    server.signal("HUP");
    server.wait_for_line_after(from, "TLS certificate reloaded");
    stdin.write_all(b"go\n").unwrap();
    stdin.flush().unwrap();
    out.wait_for("second node-b", WAIT);
    out.wait_for("old connection still node-a", WAIT);
    out.wait_for("OK: reload", WAIT);
}

/// A node's settings with the cluster CA: TLS optional on its port, so the test's plain client
/// reads its figures, while replication needs the CA's certificate whatever the port allows.
fn node_args<'a>(node: &'a (PathBuf, PathBuf), ca: &'a Path) -> Vec<&'a str> {
    vec![
        "--listen-tls",
        "optional",
        "--tls-cert",
        node.0.to_str().unwrap(),
        "--tls-key",
        node.1.to_str().unwrap(),
        "--tls-ca",
        ca.to_str().unwrap(),
    ]
}

fn stat(c: &mut Client, name: &str) -> u64 {
    let stats = c.call("queue.stats", &[]).one();
    field(&stats, name).as_u64().unwrap_or(0)
}

#[test]
fn replication_runs_over_mutual_tls_and_a_node_without_the_cluster_ca_cannot_replicate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let (a, b, x) = (
        pki.node("node-a"),
        pki.node("node-b"),
        pki.foreign_node("node-x"),
    );
    let ca = pki.ca();
    let mut primary = Tarq::start(&node_args(&a, &ca));
    let paddr = primary.addr.to_string();
    let mut p = Client::connect(primary.addr);
    let put = p.call("queue.put", &["before".into()]).one();

    // A node of the cluster replicates: over TLS, both certificates checked.
    let mut args = node_args(&b, &ca);
    args.extend(["--replica-of", &paddr]);
    let replica = Tarq::start(&args);
    primary.wait_for_line("replica subscribed");
    let mut r = Client::connect(replica.addr);
    p.call("queue.put", &["after".into()]).one();
    wait_until("the replica has both tasks", || stat(&mut r, "total") == 2);
    assert_eq!(stat(&mut r, "replication_connected"), 1);
    assert_eq!(id_of(&put), 1);

    // A node whose certificate another CA signed (it trusts the cluster's): refused in the
    // handshake, and both sides say why.
    let mut args = node_args(&x, &ca);
    args.extend(["--replica-of", &paddr]);
    let mut stranger = Tarq::start(&args);
    let line = stranger.wait_for_line("replication stopped");
    assert!(
        line.contains("did not accept this end's certificate"),
        "{line}"
    );
    println!("the stranger: {line}");
    let line = primary.wait_for_line("TLS connection failed");
    assert!(line.contains("invalid peer certificate"), "{line}");
    println!("the primary: {line}");

    // A node with no TLS at all: the primary's JOIN refusal names what is missing.
    let mut plain = Tarq::start(&["--replica-of", &paddr]);
    let line = plain.wait_for_line("replication stopped");
    assert!(
        line.contains("certificate the cluster CA signed (tls-ca); this is a plain connection"),
        "{line}"
    );
    let line = primary.wait_for_line("replica refused");
    assert!(line.contains("cluster CA"), "{line}");
    assert_eq!(stat(&mut p, "replicas"), 1, "only the node of the cluster");
}

#[test]
fn a_certificate_that_does_not_load_stops_the_start_and_a_reload_keeps_the_running_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let a = pki.node("node-a");
    let b = pki.node("node-b");
    // node-a's chain with node-b's key: they do not fit.
    let data = dir.path().join("data");
    let out = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .args(["--listen-tls", "required", "--tls-cert"])
        .arg(&a.0)
        .arg("--tls-key")
        .arg(&b.1)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("does not fit the certificate"), "{err}");

    let served = (
        dir.path().join("served.chain"),
        dir.path().join("served.key"),
    );
    std::fs::copy(&a.0, &served.0).unwrap();
    std::fs::copy(&a.1, &served.1).unwrap();
    let mut server = start(&served, &["--listen-tls", "required"]);
    std::fs::write(&served.0, "not a certificate").unwrap();
    let from = server.log().len();
    server.signal("HUP");
    let line = server.wait_for_line_after(from, "TLS certificate not reloaded");
    assert!(line.contains("no certificate in"), "{line}");
    // Still served: the running certificate.
    let addr: SocketAddr = server.addr;
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-verify_return_error", "-connect"])
        .arg(addr.to_string())
        .arg("-CAfile")
        .arg(pki.ca());
    let run = run_with_deadline(cmd, WAIT);
    assert!(
        run.stdout.contains("Verify return code: 0 (ok)"),
        "{}",
        run.stdout
    );
}
