//! The layers hold: every workspace crate depends only on the crates its layer allows
//! (ARCHITECTURE.md, "Layers"). Read from `cargo metadata`, so a new `path` dependency that
//! crosses a layer fails here, naming the edge. A new crate must be added to [`ALLOWED`].

use std::collections::BTreeSet;
use std::process::Command;

/// Each workspace crate and the workspace crates it may depend on (any dependency kind).
const ALLOWED: &[(&str, &[&str])] = &[
    // The engine never imports I/O, and nothing of ours.
    ("tarq-engine", &[]),
    // Codecs never import the server, the WAL or the engine.
    ("tarq-iproto", &[]),
    // Their tests may use testkit (the ports a peer listens on, an address that refuses), as
    // may the client's and the election's.
    ("tarq-beanstalk", &["tarq-testkit"]),
    ("tarq-client", &["tarq-iproto", "tarq-testkit"]),
    ("tarq-testkit", &[]),
    // Pinning to cores: the server's loop, the WAL's threads, the loadgen and its targets.
    ("tarq-affinity", &[]),
    // Leader election talks to etcd only; the server drives it through a channel.
    ("tarq-cluster", &["tarq-testkit"]),
    // The WAL never imports the server or ops.
    ("tarq-wal", &["tarq-engine", "tarq-wal", "tarq-affinity"]),
    // Ops sees figures and plain data, never the server or the WAL.
    ("tarq-ops", &["tarq-engine", "tarq-iproto"]),
    (
        "tarq-net",
        &[
            "tarq-engine",
            "tarq-iproto",
            "tarq-beanstalk",
            "tarq-client",
            "tarq-wal",
            "tarq-ops",
            "tarq-testkit",
            "tarq-cluster",
            "tarq-affinity",
        ],
    ),
    // The load generator speaks the protocols through the codecs and the client only; testkit
    // finds the originals its reference targets run and the ports its targets got.
    (
        "tarq-loadgen",
        &[
            "tarq-iproto",
            "tarq-client",
            "tarq-beanstalk",
            "tarq-testkit",
            "tarq-affinity",
        ],
    ),
    // The fault harness drives the server as a user would: its binary, its ports, the client
    // (and the codec's request encoding, for calls it pipelines).
    (
        "tarq-chaos",
        &["tarq-client", "tarq-iproto", "tarq-testkit"],
    ),
    (
        "tarq-benches",
        &[
            "tarq-client",
            "tarq-engine",
            "tarq-iproto",
            "tarq-net",
            "tarq-wal",
            "tarq-testkit",
            "tarq-affinity",
        ],
    ),
];

/// Crates below the loop that must not know it: they take `now` or a wake-up callback from the
/// server instead of owning a poll, so they stay testable without sockets.
const LOOP_FREE: &[&str] = &[
    "tarq-engine",
    "tarq-iproto",
    "tarq-beanstalk",
    "tarq-wal",
    "tarq-affinity",
];
/// The crates that make an event loop.
const LOOP_CRATES: &[&str] = &["mio", "signal-hook-mio", "tokio"];

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let ours: BTreeSet<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut broken = Vec::new();
    for p in packages {
        let name = p["name"].as_str().expect("a package has a name");
        let Some((_, allowed)) = ALLOWED.iter().find(|(n, _)| *n == name) else {
            broken.push(format!(
                "{name} is not in the layer table of net/tests/layers.rs"
            ));
            continue;
        };
        for dep in dependencies(p) {
            if ours.contains(dep) && !allowed.contains(&dep) {
                broken.push(format!("{name} -> {dep}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dependencies that cross the layers: {broken:#?}"
    );
}

#[test]
fn the_engine_codecs_and_wal_do_not_own_a_loop() {
    let meta = metadata();
    let mut broken = Vec::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().expect("a package has a name");
        if !LOOP_FREE.contains(&name) {
            continue;
        }
        for dep in dependencies(p) {
            if LOOP_CRATES.contains(&dep) {
                broken.push(format!("{name} -> {dep}"));
            }
        }
    }
    assert!(broken.is_empty(), "loop crates below the loop: {broken:#?}");
}

/// The names a package of `cargo metadata` depends on (every kind).
fn dependencies(p: &serde_json::Value) -> impl Iterator<Item = &str> {
    p["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .map(|d| d["name"].as_str().expect("a dependency has a name"))
}

/// The workspace's `cargo metadata`, without the dependencies' own packages.
fn metadata() -> serde_json::Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata is JSON")
}

/// Inside the server crate: modules and the modules of this crate they must not use. The
/// core runs commands for every front-end and knows none of them, nor the loop that hosts it
/// (it talks to the loop through its `Host` trait); a front-end knows the core and the loop
/// only through `frontend::Loop`, so the loop calls the front-ends and never the other way.
const MODULE_LAYERS: &[(&str, &[&str])] = &[
    // The configuration is what the operator said, read and checked: plain data the server
    // and the front-ends read, so it reads none of them, nor the core (their defaults live
    // here, beside the setting). `tarq ctl`'s flags are the one module it names, as a
    // subcommand.
    (
        "config",
        &["crate::server", "crate::frontend", "crate::core"],
    ),
    ("core", &["crate::server", "crate::frontend"]),
    ("frontend", &["crate::server"]),
    // The HTTP front-end parses requests from the bytes the loop read: no socket of its own,
    // no thread, no loop.
    (
        "frontend/http",
        &["crate::server", "mio::", "std::net::Tcp", "std::thread"],
    ),
    // The router owns the shard state and is handed the core and the wire for a call
    // (`shards::Ctx`, with the links' sockets); what only the loop can do (close a
    // connection, run a front-end) it asks for as an `Effect`. It names no `Server`, runs no
    // front-end and holds no socket: its links are protocol state over bytes.
    (
        "server/shards",
        &[
            "Server",
            "Beanstalk::new",
            "Iproto::new",
            "Http::new",
            "mio::",
            "std::net::Tcp",
            "TcpStream",
            "Registry",
        ],
    ),
    // The shards' decisions, the move machine, its simulation, the forwarded calls'
    // deadlines and the count of waiting takes are plain state: no loop, no server, no socket, no clock of their own (they
    // are handed the time), so they are tested alone.
    (
        "server/shards/decide.rs",
        &["Server", "mio::", "std::net", "Instant::now", "SystemTime"],
    ),
    (
        "server/shards/move_machine.rs",
        &["Server", "mio::", "std::net", "Instant::now", "SystemTime"],
    ),
    (
        "server/shards/sim.rs",
        &["Server", "mio::", "std::net", "Instant::now", "SystemTime"],
    ),
    (
        "server/shards/deadlines.rs",
        &["Server", "mio::", "std::net", "Instant::now", "SystemTime"],
    ),
    (
        "server/shards/waiting.rs",
        &["Server", "mio::", "std::net", "Instant::now", "SystemTime"],
    ),
];

#[test]
fn the_core_and_the_front_ends_keep_their_layers() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, forbidden) in MODULE_LAYERS {
        let dir = src.join(module);
        let files = if dir.is_file() {
            vec![dir.clone()]
        } else {
            assert!(
                dir.join("mod.rs").exists(),
                "{module} is a directory module"
            );
            rust_files(&dir)
        };
        for path in files {
            let text = std::fs::read_to_string(&path).expect("a source file");
            for (n, line) in text.lines().enumerate() {
                for f in *forbidden {
                    if line.contains(f) && !line.trim_start().starts_with("//") {
                        broken.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "uses that cross the layers: {broken:#?}");
}

/// Every `.rs` file under `dir`, in its subdirectories too.
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}
