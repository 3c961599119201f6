//! No function in `net/src` runs over [`MAX_LINES`] lines, except the flat tables listed in
//! [`FLAT`] (a struct literal of every setting or figure, a table of commands): a longer
//! function is one a reader has to hold in their head whole, and is split instead. Read from
//! the sources as rustfmt leaves them: a function is its `fn` line to the `}` at its indent.

use std::path::{Path, PathBuf};

/// The most lines a function may have, its signature and closing brace included.
const MAX_LINES: usize = 70;

/// Functions allowed to be longer, by file and name, with why.
const FLAT: &[(&str, &str, &str)] = &[
    (
        "server/reload.rs",
        "merge",
        "one line a setting: which take effect live and which need a restart",
    ),
    (
        "config/mod.rs",
        "resolve",
        "the struct literal of every setting, from flag, TARQ_* or TOML",
    ),
    (
        "server/mod.rs",
        "with_journal",
        "the struct literal of the server's parts",
    ),
    (
        "frontend/beanstalk/stats.rs",
        "bs_stats",
        "the struct literal of beanstalkd's stats fields",
    ),
    ("ctl/console.rs", "calls_parse", "a test's table of inputs"),
    (
        "ctl/cluster.rs",
        "a_sharded_cluster_prints_its_sets_and_placement",
        "a test's expected table",
    ),
    (
        "frontend/link/call.rs",
        "of",
        "one arm a command: the core's command as the link's call",
    ),
    (
        "frontend/link/call.rs",
        "command",
        "one arm a call: the link's call as the core's command",
    ),
    (
        "frontend/link/golden.rs",
        "asks",
        "a test's table of one sample a message",
    ),
];

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable source dir") {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The name of the function a line declares, if it does (`fn`, with any of `pub`, `const`,
/// `async`, `unsafe` before it), and its indent.
fn declared(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start().len();
    let mut words = line.trim_start();
    loop {
        let word = words.split_whitespace().next()?;
        let vis = word.starts_with("pub(") || word == "pub";
        if vis || matches!(word, "const" | "async" | "unsafe" | "extern" | "\"C\"") {
            words = words[word.len()..].trim_start();
            continue;
        }
        let rest = words.strip_prefix("fn ")?;
        let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
        return Some((indent, &rest[..end]));
    }
}

/// Every function of `text` longer than [`MAX_LINES`]: its name, first line and length.
fn long_functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, name)) = declared(lines[i]) else {
            i += 1;
            continue;
        };
        // The body opens on the line ending the signature; a declaration ends with `;`.
        let mut open = i;
        while open < lines.len() && !lines[open].trim_end().ends_with('{') {
            if lines[open].trim_end().ends_with(';') {
                break;
            }
            open += 1;
        }
        if open >= lines.len() || !lines[open].trim_end().ends_with('{') {
            i = open + 1;
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = (open + 1..lines.len())
            .find(|&k| lines[k].trim_end() == close)
            .unwrap_or(lines.len() - 1);
        let n = end - i + 1;
        if n > MAX_LINES {
            long.push((name.to_owned(), i + 1, n));
        }
        i = end + 1;
    }
    long
}

#[test]
fn no_function_in_net_src_is_over_seventy_lines_but_the_flat_tables() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 50, "net/src read: {} files", files.len());
    let mut over = Vec::new();
    let mut flat_seen = Vec::new();
    for path in files {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(&path).unwrap();
        for (name, line, n) in long_functions(&text) {
            if FLAT.iter().any(|(f, fname, _)| *f == rel && *fname == name) {
                flat_seen.push((rel.clone(), name));
            } else {
                over.push(format!("net/src/{rel}:{line} fn {name}: {n} lines"));
            }
        }
    }
    assert!(
        over.is_empty(),
        "functions over {MAX_LINES} lines (split them, or list a flat table in FLAT):\n{}",
        over.join("\n")
    );
    for (file, name, _) in FLAT {
        assert!(
            flat_seen.iter().any(|(f, n)| f == file && n == name),
            "{file} fn {name} is listed in FLAT but is no longer over {MAX_LINES} lines: \
             take it off the list"
        );
    }
}

#[test]
fn the_scan_finds_a_long_function_and_skips_declarations() {
    let body = "    let x = 1;\n".repeat(MAX_LINES);
    let text = format!(
        "trait T {{\n    fn declared(&self);\n}}\n\npub(crate) fn long() {{\n{body}}}\n\n\
         fn short() {{\n    1;\n}}\n"
    );
    let found = long_functions(&text);
    assert_eq!(found, vec![("long".to_owned(), 5, MAX_LINES + 2)]);
    assert_eq!(declared("    pub async fn go(x: u8) {"), Some((4, "go")));
    assert_eq!(declared("let f = 1;"), None);
}
