//! The layered configuration through the real binary: the command line wins over the
//! environment (`TARQ_...`), the environment over the `--config` file, setting by setting; a
//! value refused from the environment names its variable; a key the file misspells is named
//! with the keys there are; the password comes from the environment or from a file, and a
//! reload (SIGHUP) reads that file again.

mod support;

use std::io::Read;
use std::process::{Command, Stdio};

use support::{Proc, Tarq, BIN};

/// The stderr of `tarq args...` run with `env` (and no other `TARQ_` setting of the test's own
/// environment), which must refuse to start. One that starts anyway (on port 0, in a temporary
/// directory) fails the test after [`support::WAIT`] instead of serving on.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("TARQ_LOG_LEVEL")
        .env_remove("TARQ_MAX_CONNECTIONS")
        .env("TARQ_LISTEN", "127.0.0.1:0")
        .env("TARQ_DATA_DIR", dir.path())
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut tarq = Proc::spawn(&mut cmd);
    let mut stderr = tarq.0.stderr.take().unwrap();
    let status = tarq.wait_exit();
    assert!(!status.success(), "it started: {status}");
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    err
}

#[test]
fn the_command_line_wins_over_the_environment_which_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tarq.toml");
    // A log level no layer may hold: the error names the one that won.
    std::fs::write(
        &path,
        "log-level = \"from-file\"\nmax-frame-bytes = 1000000\n",
    )
    .unwrap();
    let config = ["--config", path.to_str().unwrap()];
    let env = [("TARQ_LOG_LEVEL", "from-env")];
    let err = refused(&[&config[..], &["--log-level", "from-flag"]].concat(), &env);
    assert!(
        err.starts_with("Error: log-level 'from-flag' is not one of"),
        "{err}"
    );
    let err = refused(&config, &env);
    assert!(
        err.starts_with("Error: log-level 'from-env' is not one of"),
        "{err}"
    );
    let err = refused(&config, &[]);
    assert!(
        err.starts_with("Error: log-level 'from-file' is not one of"),
        "{err}"
    );
    // Layers merge setting by setting: the file's frame cap meets the environment's backlog.
    let err = refused(
        &config,
        &[("TARQ_LOG_LEVEL", "info"), ("TARQ_MAX_WRITE_BACKLOG", "10")],
    );
    assert_eq!(
        err.trim_end(),
        "Error: max-write-backlog 10 must be at least twice max-frame-bytes (1000000)"
    );
}

#[test]
fn a_value_refused_from_the_environment_names_its_variable() {
    let env = [("TARQ_MAX_CONNECTIONS", "0")];
    let err = refused(&[], &env);
    assert!(
        err.contains(
            "invalid value '0' for '--max-connections <N>': must be a whole number from 1 to \
             16777216"
        ),
        "{err}"
    );
    assert!(
        err.contains("tip: the value comes from TARQ_MAX_CONNECTIONS in the environment"),
        "{err}"
    );
    // The same value on the command line is the flag's, whatever the environment holds.
    let err = refused(&["--max-connections", "0"], &env);
    assert!(err.contains("from 1 to 16777216"), "{err}");
    assert!(!err.contains("TARQ_MAX_CONNECTIONS"), "{err}");
    let err = refused(&[], &[("TARQ_NULL", "maybe")]);
    assert!(
        err.contains("'maybe' for '--null [<BOOL>]'") && err.contains("TARQ_NULL"),
        "{err}"
    );
}

#[test]
fn a_misspelt_key_in_the_file_is_named_with_the_keys_there_are() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tarq.toml");
    std::fs::write(
        &path,
        "user = \"u\"\npasword-file = \"/etc/tarq/password\"\n",
    )
    .unwrap();
    let err = refused(&["--config", path.to_str().unwrap()], &[]);
    assert!(
        err.starts_with(&format!(
            "Error: bad config file {}: TOML parse error at line 2, column 1",
            path.display()
        )),
        "{err}"
    );
    assert!(
        err.contains("unknown field `pasword-file`, expected one of `listen`,"),
        "{err}"
    );
    assert!(err.contains("`password-file`"), "{err}");
}

/// `tarq ctl stats` logging in to `server` as `u` with `password`: whether it was let in.
/// Its own environment holds server settings, which ctl leaves alone.
fn logs_in(server: &Tarq, password: &str) -> bool {
    let out = Command::new(BIN)
        .args(["ctl", "--addr", &server.addr.to_string()])
        .args(["--user", "u", "--password", password, "stats"])
        .env("TARQ_PASSWORD", "not ctl's")
        .env("TARQ_LISTEN", "127.0.0.1:1")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || err.contains("refused the login"),
        "{err}"
    );
    out.status.success()
}

/// `tarq --user u` with `args`, `env`, on port 0 in a temporary directory.
fn start(args: &[&str], env: &[(&str, &str)]) -> Tarq {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .args(["--user", "u"])
    .args(args)
    .envs(env.iter().copied());
    Tarq::spawn_cmd(dir, cmd)
}

#[test]
fn the_password_comes_from_the_environment() {
    let server = start(&[], &[("TARQ_PASSWORD", "from-env")]);
    assert!(logs_in(&server, "from-env"));
    assert!(!logs_in(&server, "not ctl's"));
}

#[test]
fn the_password_comes_from_a_file_read_again_on_reload() {
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("password");
    std::fs::write(&file, "first\n").unwrap();
    let file_arg = file.to_str().unwrap();
    // The variable names the file; a password in the environment would be the same layer.
    let mut server = start(&[], &[("TARQ_PASSWORD_FILE", file_arg)]);
    assert!(logs_in(&server, "first"));
    assert!(!logs_in(&server, "first\n"));

    std::fs::write(&file, "second\n").unwrap();
    server.signal("HUP");
    let line = server.wait_for_line("configuration reloaded");
    assert!(line.contains("user/password: changed"), "{line}");
    assert!(
        !line.contains("second"),
        "the password stays out of the log: {line}"
    );
    assert!(logs_in(&server, "second"));
    assert!(!logs_in(&server, "first"));
}
