//! The `tarq` binary as a systemd `Type=notify` service sees it: the notifications it sends on
//! the socket `NOTIFY_SOCKET` names (`READY=1` once it serves, `RELOADING=1` and `READY=1`
//! around a SIGHUP reload, `STOPPING=1` on SIGTERM), read here from a datagram socket the test
//! binds in place of systemd's. The unit file and the Debian package are tested in
//! `package.rs`.

mod support;

use std::os::unix::net::UnixDatagram;
use std::process::Command;

use rmpv::Value;
use support::{Client, Tarq, BIN, WAIT};

/// The next notification, as text; fails the test after [`WAIT`].
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification within {WAIT:?}: {e}"));
    String::from_utf8(buf[..n].to_vec()).expect("notifications are text")
}

#[test]
fn systemd_hears_ready_once_tarq_serves_then_reloading_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let data = dir.path().join("data");
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("NOTIFY_SOCKET", &notify);
    // Returns once tarq logged that it serves.
    let mut t = Tarq::spawn_cmd(dir, cmd);
    assert_eq!(next(&sock), "READY=1\n");
    let put = Client::connect(t.addr).call("queue.put", &[Value::from("x")]);
    assert!(put.error.is_none(), "a READY tarq serves: {put:?}");

    let from = t.log().len();
    t.signal("HUP");
    let reloading = next(&sock);
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{reloading:?}"
    );
    assert_eq!(next(&sock), "READY=1\n", "ready again after the reload");
    t.wait_for_line_after(from, "configuration reloaded");

    t.signal("TERM");
    assert_eq!(next(&sock), "STOPPING=1\n");
    assert!(t.proc.wait_exit().success());
}
