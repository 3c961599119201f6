//! Where the originals tarq is compared against are found, and what a test does without them.
//! The originals are the article's queue (`tarantool-seed/init.lua` beside its `queue.lua`) and
//! tarantool/queue 1.5.0 (`tarantool-queue/serve.lua` beside its `queue/`). Their code is not
//! ours to ship, so the repository does not hold them: a directory holding both layouts is named
//! by `TARQ_REFERENCE_DIR`, or else is `../shared/reference` beside the workspace when that
//! exists (the maintainers' machines). `TARQ_SEED_INIT` and `TARQ_QUEUE_SERVE` still name one
//! file each and win over the directory.
//!
//! [`locate`] answers where a file is or why it is not there (with where to get it); the
//! loadgen uses it to start a reference target. [`needed`] is a test's rule: found, the path;
//! absent under `CI=true`, the test fails with that message; absent elsewhere, the test passes
//! after printing `SKIPPED: …` to stderr and appending the same line to the file named by
//! `TARQ_SKIP_LOG` (`bash .ci/test` sets it and lists the skips at the end). Finding the files
//! does not start anything: Tarantool itself is a tool the tests require as any other.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory holding the originals, in the layout of [`Original::file`].
pub const DIR_VAR: &str = "TARQ_REFERENCE_DIR";
/// The file a skipped test appends its `SKIPPED: …` line to, when set.
pub const SKIP_LOG_VAR: &str = "TARQ_SKIP_LOG";
/// Where the originals are looked for when [`DIR_VAR`] is unset, relative to the workspace.
pub const DEFAULT_DIR: &str = "../shared/reference";

/// One of the originals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Original {
    /// The article's queue: `init.lua` running its final `queue.lua` on Tarantool.
    SeedQueue,
    /// tarantool/queue 1.5.0 with `serve.lua`, the launcher that serves it over IPROTO.
    TarantoolQueue,
}

impl Original {
    /// The file a test or the loadgen runs, relative to the reference directory.
    pub fn file(self) -> &'static str {
        match self {
            Original::SeedQueue => "tarantool-seed/init.lua",
            Original::TarantoolQueue => "tarantool-queue/serve.lua",
        }
    }

    /// The older variable naming that one file.
    pub fn file_var(self) -> &'static str {
        match self {
            Original::SeedQueue => "TARQ_SEED_INIT",
            Original::TarantoolQueue => "TARQ_QUEUE_SERVE",
        }
    }

    /// What it is, in words.
    pub fn name(self) -> &'static str {
        match self {
            Original::SeedQueue => "the article's queue",
            Original::TarantoolQueue => "tarantool/queue 1.5.0",
        }
    }

    /// Where to get it and how to lay it out.
    pub fn how_to_get(self) -> String {
        match self {
            Original::SeedQueue => format!(
                "It is the final queue.lua of the article \"How to build a high-performance \
                 application on Tarantool from scratch\" (tarantool.io blog, October 2020), put in \
                 ${DIR_VAR}/tarantool-seed/ with an init.lua beside it that sets box.cfg from \
                 $LISTEN, $WORKDIR, $LOGFILE and $WAL_MODE, grants guest, and sets the global \
                 queue = require 'queue'."
            ),
            Original::TarantoolQueue => format!(
                "Get it with `git clone --branch 1.5.0 https://github.com/tarantool/queue \
                 ${DIR_VAR}/tarantool-queue` and add a serve.lua beside its queue/ directory that \
                 sets box.cfg from $LISTEN, $WORKDIR, $LOGFILE and $WAL_MODE, grants guest, puts \
                 require('queue') in the global queue and creates the tubes listed in $TUBES \
                 (name:type,...)."
            ),
        }
    }
}

/// Where `original` is: the file named by its own variable, else under `$TARQ_REFERENCE_DIR`,
/// else under [`DEFAULT_DIR`] beside `workspace_root`. The error says what is missing, where
/// it was looked for, and where to get it.
pub fn locate(original: Original, workspace_root: &Path) -> Result<PathBuf, String> {
    let var = original.file_var();
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "{} not found: {var}={} is not a file. {}",
                original.name(),
                p.display(),
                original.how_to_get()
            ))
        };
    }
    let (dir, from_var) = match std::env::var_os(DIR_VAR).filter(|p| !p.is_empty()) {
        Some(d) => (PathBuf::from(d), true),
        None => (workspace_root.join(DEFAULT_DIR), false),
    };
    let file = dir.join(original.file());
    if file.is_file() {
        return Ok(file.canonicalize().unwrap_or(file));
    }
    let looked = if from_var {
        format!("{DIR_VAR}={} has no {}", dir.display(), original.file())
    } else {
        format!("{DIR_VAR} is unset and {} does not exist", file.display())
    };
    Err(format!(
        "{} not found: {looked}. {}",
        original.name(),
        original.how_to_get()
    ))
}

/// True when the run is CI's (`CI=true`), where nothing may be skipped.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A test's rule for `original`: its path when found; when it is not, under `CI=true` a panic
/// with [`locate`]'s message, elsewhere `None` once the skip is said (see [`skip`]). The
/// caller returns on `None`: the test passes without having run.
pub fn needed(original: Original, workspace_root: &Path) -> Option<PathBuf> {
    match locate(original, workspace_root) {
        Ok(p) => Some(p),
        Err(why) if ci() => panic!("{why}\n(CI=true: the originals are required)"),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

/// Says a test is skipped and why: `SKIPPED: <test>: <why>` on stderr (nextest shows it with
/// the test's output) and, when `TARQ_SKIP_LOG` names a file, appended to it as one line.
pub fn skip(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let binary = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
    let line = format!("SKIPPED: {binary} {test}: {}", why.replace('\n', " "));
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR).filter(|p| !p.is_empty()) {
        // One write of one line to a file opened for appending: lines of tests running at once
        // do not interleave.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            eprintln!(
                "cannot append the skip to {}: {e}",
                Path::new(&path).display()
            );
        }
    }
}

/// The workspace root above `manifest_dir` (a crate's `CARGO_MANIFEST_DIR`): the nearest
/// ancestor whose `Cargo.toml` declares `[workspace]`, else `manifest_dir` itself.
pub fn workspace_root(manifest_dir: &Path) -> PathBuf {
    manifest_dir
        .ancestors()
        .find(|d| {
            std::fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .unwrap_or(manifest_dir)
        .to_path_buf()
}
