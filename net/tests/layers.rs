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
    ("tarq-beanstalk", &[]),
    ("tarq-client", &["tarq-iproto"]),
    ("tarq-testkit", &[]),
    ("tarq-beanstalk", &[]),
    // Leader election talks to etcd only; the server drives it through a channel.
    ("tarq-cluster", &[]),
    // The WAL never imports the server or ops.
    ("tarq-wal", &["tarq-engine", "tarq-wal"]),
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
            "tarq-beanstalk",
            "tarq-cluster",
        ],
    ),
    // The load generator speaks the protocols through the codecs and the client only.
    (
        "tarq-loadgen",
        &["tarq-iproto", "tarq-client", "tarq-beanstalk"],
    ),
    (
        "tarq-benches",
        &[
            "tarq-engine",
            "tarq-iproto",
            "tarq-net",
            "tarq-wal",
            "tarq-testkit",
        ],
    ),
];

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
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
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
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
        for d in p["dependencies"].as_array().expect("dependencies") {
            let dep = d["name"].as_str().expect("a dependency has a name");
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
