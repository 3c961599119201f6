//! The workspace's `rust-version` is a compiler that builds it. Our own code is held to it by
//! clippy's `incompatible_msrv` (denied in the root Cargo.toml, run by `.ci/run`); this test
//! holds the dependencies to it: every package the build resolves declares a `rust-version` no
//! newer than ours, so a `cargo update` that needs a newer compiler fails here, naming it.

use std::process::Command;

#[test]
fn no_dependency_needs_a_newer_compiler_than_the_workspace_declares() {
    let meta = metadata();
    let packages = meta["packages"].as_array().expect("packages");
    let ours = packages
        .iter()
        .find(|p| p["name"] == "tarq-net")
        .and_then(|p| p["rust_version"].as_str())
        .expect("tarq-net inherits the workspace's rust-version");
    let declared = ours;
    let ours = version(ours);
    let resolved: Vec<&str> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve nodes")
        .iter()
        .filter_map(|n| n["id"].as_str())
        .collect();
    let newer: Vec<String> = packages
        .iter()
        .filter(|p| resolved.contains(&p["id"].as_str().unwrap_or_default()))
        .filter_map(|p| {
            let wants = p["rust_version"].as_str()?;
            let (name, at) = (p["name"].as_str()?, p["version"].as_str()?);
            (version(wants) > ours).then(|| format!("{name} {at} wants {wants}"))
        })
        .collect();
    assert!(
        newer.is_empty(),
        "dependencies that need a newer compiler than rust-version {declared}: {newer:#?}"
    );
}

/// `1.88` or `1.88.0` as (1, 88, 0).
fn version(v: &str) -> (u32, u32, u32) {
    let mut parts = v
        .split('.')
        .map(|p| p.parse().unwrap_or_else(|_| panic!("a version: {v}")));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}

/// The workspace's `cargo metadata` with its dependencies, for the host only: other targets'
/// dependencies are not built here, and need not be downloaded.
fn metadata() -> serde_json::Value {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let info = Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("rustc -vV runs");
    let info = String::from_utf8(info.stdout).expect("rustc -vV prints UTF-8");
    let host = info
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("rustc -vV names the host");
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--filter-platform",
            host,
        ])
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
