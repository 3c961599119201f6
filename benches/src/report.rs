//! Turns bench runs into data: a JSON record under `results/engine/<date>-<commit>.json`
//! holding the commit, the machine (CPU model, cores, kernel), the command line and one
//! section per bench binary (criterion's estimates, the advance worst steps, the memory
//! figures). Each binary updates only its own section, so `cargo bench --bench engine` and
//! `--bench engine_memory` can run in any order. Nobody edits these files by hand.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// The workspace root (this crate lives in `<root>/benches`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

/// Where criterion keeps its estimates: `$CARGO_TARGET_DIR/criterion` or `<root>/target/criterion`.
pub fn criterion_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("criterion")
}

/// The short commit, with `-dirty` when the work tree has uncommitted changes.
pub fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty {
        format!("{head}-dirty")
    } else {
        head
    }
}

/// Today's date (UTC) as YYYY-MM-DD, from the days since the epoch (Howard Hinnant's
/// civil-from-days).
pub fn date_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// CPU model, logical cores, the cores this process may run on (taskset) and the kernel.
pub fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let allowed = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .ok();
    json!({ "cpu": cpu, "cores": cores, "cpus_allowed": allowed, "kernel": kernel })
}

/// The record of this commit and day.
pub fn results_path() -> PathBuf {
    workspace_root()
        .join("results")
        .join("engine")
        .join(format!("{}-{}.json", date_utc(), commit()))
}

/// Sets `section` in this commit's record (creating it with the commit and machine), keeping
/// what other bench binaries wrote. Returns the path written.
pub fn update(section: &str, value: Value) -> std::io::Result<PathBuf> {
    let path = results_path();
    let mut doc: Map<String, Value> = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    doc.insert("commit".into(), json!(commit()));
    doc.insert("date".into(), json!(date_utc()));
    doc.insert("machine".into(), machine());
    let args: Vec<String> = std::env::args().skip(1).collect();
    doc.insert(format!("{section}_args"), json!(args));
    doc.insert(section.into(), value);
    std::fs::create_dir_all(path.parent().expect("results dir"))?;
    let text = serde_json::to_string_pretty(&Value::Object(doc)).expect("json");
    std::fs::write(&path, text + "\n")?;
    Ok(path)
}

/// Criterion's estimates for one benchmark (`group/function/parameter`), in nanoseconds:
/// median and mean with their confidence bounds. None if it did not run.
pub fn estimates(group: &str, function: &str, parameter: &str) -> Option<Value> {
    let path = criterion_dir()
        .join(group)
        .join(function)
        .join(parameter)
        .join("new")
        .join("estimates.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    let pick = |name: &str| {
        let e = &v[name];
        json!({
            "point": e["point_estimate"],
            "low": e["confidence_interval"]["lower_bound"],
            "high": e["confidence_interval"]["upper_bound"],
        })
    };
    Some(json!({ "median_ns": pick("median"), "mean_ns": pick("mean") }))
}
