//! `tarq ctl console`: the `tarantoolctl connect` experience. A line such as
//! `queue.put('x', {delay=1.5})` is parsed here as a call with Lua-ish literal arguments —
//! strings, numbers, `nil`/`box.NULL`, `true`/`false`, tables `{a=1}` and `{1,2}` — sent as an
//! IPROTO CALL through [`tarq_client::cluster::Cluster`] (so it follows the leader as `tarq
//! ctl` does; the prompt shows the node in use), and its results printed as JSON. Line editing
//! and history come from rustyline.
//!
//! The parser ([`parse_line`]) is a small recursive descent over the line, with the nesting
//! depth bounded so no input can exhaust the stack.

use std::path::PathBuf;
use std::time::Duration;

use rmpv::Value;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

use tarq_client::cluster::{Cluster, ClusterError, Effect};

/// Deepest table nesting accepted in a console line: far beyond any hand-typed argument, far
/// below what the parser's recursion could overflow.
pub const MAX_NESTING: usize = 64;

/// Lines kept in the history file.
pub const HISTORY_LINES: usize = 1000;

/// History file name in the home directory when `--history` is not given.
pub const HISTORY_FILE: &str = ".tarq_history";

/// What a console line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// Nothing to do (blank, or a `--` comment).
    Empty,
    Quit,
    Help,
    /// Call `function` with `args` (a MessagePack array).
    Call {
        function: String,
        args: Vec<Value>,
    },
}

/// A line that is not a call, with the column (from 1) where it went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {column}: {message}")]
pub struct ParseError {
    pub column: usize,
    pub message: String,
}

/// Parses one console line.
pub fn parse_line(line: &str) -> Result<Line, ParseError> {
    let mut p = Parser {
        s: line.as_bytes(),
        i: 0,
    };
    p.skip_ws();
    if p.at_end() {
        return Ok(Line::Empty);
    }
    let rest = line[p.i..].trim_end().trim_end_matches(';').trim_end();
    match rest {
        "quit" | "exit" | "\\q" | "os.exit()" => return Ok(Line::Quit),
        "help" | "\\h" | "?" => return Ok(Line::Help),
        _ => {}
    }
    // `return f(...)`, as one types in Tarantool's console, means the same call.
    if p.s[p.i..].starts_with(b"return") && p.s.get(p.i + 6).is_some_and(u8::is_ascii_whitespace) {
        p.i += 6;
        p.skip_ws();
    }
    let function = p.name()?;
    p.skip_ws();
    let args = match p.peek() {
        Some(b'(') => {
            p.i += 1;
            let mut args = Vec::new();
            p.skip_ws();
            if p.peek() == Some(b')') {
                p.i += 1;
            } else {
                loop {
                    args.push(p.value(0)?);
                    p.skip_ws();
                    match p.peek() {
                        Some(b',') => p.i += 1,
                        Some(b')') => {
                            p.i += 1;
                            break;
                        }
                        _ => return Err(p.error("expected ',' or ')' after an argument")),
                    }
                }
            }
            args
        }
        // Lua's call sugar: f'x', f"x", f[[x]] and f{...} take that one literal.
        Some(b'\'' | b'"' | b'{' | b'[') => vec![p.value(0)?],
        _ => return Err(p.error("expected '(' and the arguments after the function name")),
    };
    p.skip_ws();
    while p.peek() == Some(b';') {
        p.i += 1;
        p.skip_ws();
    }
    if !p.at_end() {
        return Err(p.error("unexpected text after the call"));
    }
    Ok(Line::Call { function, args })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            column: self.i + 1,
            message: message.into(),
        }
    }

    /// An error pointing at the byte just consumed.
    fn error_before(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            column: self.i.max(1),
            message: message.into(),
        }
    }

    /// Skips blanks and a `--` comment running to the end of the line.
    fn skip_ws(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_ascii_whitespace() {
                self.i += 1;
            } else if self.s[self.i..].starts_with(b"--") {
                self.i = self.s.len();
            } else {
                break;
            }
        }
    }

    fn ident(&mut self) -> Option<&str> {
        let start = self.i;
        if !self
            .peek()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        {
            return None;
        }
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            self.i += 1;
        }
        // Identifiers are ASCII, so the slice is valid UTF-8.
        std::str::from_utf8(&self.s[start..self.i]).ok()
    }

    /// A dotted function name, `queue.put`, or a tube's method in the colon form Lua writes,
    /// `queue.tube.jobs:put` (sent as that name, as net.box sends it).
    fn name(&mut self) -> Result<String, ParseError> {
        let mut name = match self.ident() {
            Some(id) => id.to_string(),
            None => return Err(self.error("expected a function name such as queue.put")),
        };
        while self.peek() == Some(b'.') {
            self.i += 1;
            match self.ident() {
                Some(id) => {
                    name.push('.');
                    name.push_str(id);
                }
                None => return Err(self.error("expected a name after '.'")),
            }
        }
        if self.peek() == Some(b':') {
            self.i += 1;
            match self.ident() {
                Some(id) => {
                    name.push(':');
                    name.push_str(id);
                }
                None => return Err(self.error("expected a method name after ':'")),
            }
        }
        Ok(name)
    }

    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.skip_ws();
        match self.peek() {
            None => Err(self.error("expected a value")),
            Some(b'\'' | b'"') => self.quoted().map(Value::from),
            Some(b'[') => self.long_string().map(Value::from),
            Some(b'{') => self.table(depth + 1),
            Some(b'-' | b'.' | b'0'..=b'9') => self.number(),
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.i;
                let word = self.name()?;
                match word.as_str() {
                    "nil" | "box.NULL" => Ok(Value::Nil),
                    "true" => Ok(Value::Boolean(true)),
                    "false" => Ok(Value::Boolean(false)),
                    _ => {
                        self.i = start;
                        Err(self.error(format!(
                            "'{word}' is not a literal: quote strings ('{word}')"
                        )))
                    }
                }
            }
            Some(c) => Err(self.error(format!("unexpected '{}'", c as char))),
        }
    }

    fn quoted(&mut self) -> Result<String, ParseError> {
        let quote = self.bump().expect("called at a quote");
        let start = self.i - 1;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.bump() else {
                self.i = start;
                return Err(self.error("unfinished string"));
            };
            match c {
                c if c == quote => break,
                b'\\' => {
                    let Some(e) = self.bump() else {
                        self.i = start;
                        return Err(self.error("unfinished string"));
                    };
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'a' => out.push(0x07),
                        b'b' => out.push(0x08),
                        b'f' => out.push(0x0c),
                        b'v' => out.push(0x0b),
                        b'\\' | b'"' | b'\'' | b'\n' => out.push(e),
                        b'x' => {
                            let hex = self.s.get(self.i..self.i + 2).unwrap_or(b"");
                            let v = std::str::from_utf8(hex)
                                .ok()
                                .and_then(|h| u8::from_str_radix(h, 16).ok())
                                .ok_or_else(|| self.error("\\x needs two hex digits"))?;
                            self.i += 2;
                            out.push(v);
                        }
                        b'0'..=b'9' => {
                            let mut v = u32::from(e - b'0');
                            for _ in 0..2 {
                                match self.peek() {
                                    Some(d @ b'0'..=b'9') => {
                                        v = v * 10 + u32::from(d - b'0');
                                        self.i += 1;
                                    }
                                    _ => break,
                                }
                            }
                            let v = u8::try_from(v).map_err(|_| {
                                self.error_before(format!("escape \\{v} is above 255"))
                            })?;
                            out.push(v);
                        }
                        other => {
                            return Err(
                                self.error_before(format!("unknown escape \\{}", other as char))
                            )
                        }
                    }
                }
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| {
            self.i = start;
            self.error("the string is not valid UTF-8")
        })
    }

    /// `[[...]]` or `[==[...]==]`, no escapes.
    fn long_string(&mut self) -> Result<String, ParseError> {
        let start = self.i;
        self.i += 1;
        let mut level = 0;
        while self.peek() == Some(b'=') {
            level += 1;
            self.i += 1;
        }
        if self.bump() != Some(b'[') {
            self.i = start;
            return Err(self.error("expected a value ('[' starts a [[long string]] only)"));
        }
        let close: Vec<u8> = std::iter::once(b']')
            .chain(std::iter::repeat_n(b'=', level))
            .chain(std::iter::once(b']'))
            .collect();
        let body_start = self.i;
        let Some(len) = self.s[body_start..]
            .windows(close.len())
            .position(|w| w == close.as_slice())
        else {
            self.i = start;
            return Err(self.error("unfinished long string"));
        };
        self.i = body_start + len + close.len();
        String::from_utf8(self.s[body_start..body_start + len].to_vec()).map_err(|_| {
            self.i = start;
            self.error("the string is not valid UTF-8")
        })
    }

    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.i;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.i += 1;
        }
        let digits_start = self.i;
        if self.s[self.i..].starts_with(b"0x") || self.s[self.i..].starts_with(b"0X") {
            self.i += 2;
            while self.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                self.i += 1;
            }
            let hex = std::str::from_utf8(&self.s[digits_start + 2..self.i]).unwrap_or("");
            let v = u64::from_str_radix(hex, 16).map_err(|_| {
                self.i = start;
                self.error("bad hexadecimal number")
            })?;
            return signed(v, negative).ok_or_else(|| {
                self.i = start;
                self.error("number out of range")
            });
        }
        let mut float = false;
        while let Some(c) = self.peek() {
            match c {
                b'0'..=b'9' => {}
                b'.' | b'e' | b'E' => float = true,
                b'+' | b'-' if matches!(self.s[self.i - 1], b'e' | b'E') => {}
                _ => break,
            }
            self.i += 1;
        }
        let text = std::str::from_utf8(&self.s[digits_start..self.i]).unwrap_or("");
        let bad = |p: &mut Self, what: &str| {
            let shown = String::from_utf8_lossy(&p.s[start..p.i]).into_owned();
            p.i = start;
            p.error(format!("{what} '{shown}'"))
        };
        if text.is_empty() {
            return Err(bad(self, "expected a number after"));
        }
        if float {
            let v: f64 = text.parse().map_err(|_| bad(self, "bad number"))?;
            return Ok(Value::F64(if negative { -v } else { v }));
        }
        let v: u64 = text.parse().map_err(|_| bad(self, "number out of range"))?;
        signed(v, negative).ok_or_else(|| bad(self, "number out of range"))
    }

    /// `{1, 2}` is an array, `{a=1, ['b c']=2}` a map; both kinds at once make a map where the
    /// positional items have the keys 1, 2, ... as in Lua. `{}` is an empty map (an options
    /// table, the usual reason to type it).
    fn table(&mut self, depth: usize) -> Result<Value, ParseError> {
        if depth > MAX_NESTING {
            return Err(self.error(format!("tables nested deeper than {MAX_NESTING}")));
        }
        self.i += 1; // '{'
        let mut items: Vec<Value> = Vec::new();
        let mut pairs: Vec<(Value, Value)> = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() == Some(b'}') {
                self.i += 1;
                break;
            }
            let key = self.table_key(depth)?;
            match key {
                Some(k) => {
                    self.skip_ws();
                    if self.peek() != Some(b'=') {
                        return Err(self.error("expected '=' after a table key"));
                    }
                    self.i += 1;
                    let v = self.value(depth)?;
                    pairs.push((k, v));
                }
                None => items.push(self.value(depth)?),
            }
            self.skip_ws();
            match self.peek() {
                Some(b',' | b';') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    break;
                }
                _ => return Err(self.error("expected ',' or '}' in a table")),
            }
        }
        Ok(table_value(items, pairs))
    }

    /// A table item's key, if it has one: `[expr] =` or `name =` (the `=` left to read), else
    /// `None` with nothing read (a positional value).
    fn table_key(&mut self, depth: usize) -> Result<Option<Value>, ParseError> {
        let save = self.i;
        let bracket = self.peek() == Some(b'[')
            && self.s.get(self.i + 1) != Some(&b'[')
            && self.s.get(self.i + 1) != Some(&b'=');
        if bracket {
            self.i += 1;
            self.skip_ws();
            let key_start = self.i;
            let k = self.value(depth)?;
            if k.is_nil() {
                self.i = key_start;
                return Err(self.error("a table key cannot be nil"));
            }
            self.skip_ws();
            if self.peek() != Some(b']') {
                return Err(self.error("expected ']' after a table key"));
            }
            self.i += 1;
            return Ok(Some(k));
        }
        if let Some(id) = self.ident().map(str::to_string) {
            self.skip_ws();
            if self.peek() == Some(b'=') && self.s.get(self.i + 1) != Some(&b'=') {
                return Ok(Some(Value::from(id)));
            }
        }
        self.i = save;
        Ok(None)
    }
}

/// A table's value from its positional items and keyed pairs: an array, a map, or both in one
/// map with the items under 1, 2, ... as in Lua.
fn table_value(items: Vec<Value>, pairs: Vec<(Value, Value)>) -> Value {
    match (items.is_empty(), pairs.is_empty()) {
        (false, true) => Value::Array(items),
        (true, _) => Value::Map(pairs),
        (false, false) => {
            let mut map: Vec<(Value, Value)> = items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (Value::from(i as u64 + 1), v))
                .collect();
            map.extend(pairs);
            Value::Map(map)
        }
    }
}

/// A take may legitimately wait: its timeout comes on top of the usual reply timeout.
fn take_wait(function: &str, args: &[Value]) -> Option<Duration> {
    if function != "queue.take" {
        return None;
    }
    let secs = match args.first()? {
        Value::F64(f) => *f,
        Value::Integer(i) => i.as_f64()?,
        Value::String(s) => s.as_str()?.parse().ok()?,
        _ => return None,
    };
    Duration::try_from_secs_f64(secs).ok()
}

fn signed(v: u64, negative: bool) -> Option<Value> {
    if !negative {
        return Some(Value::from(v));
    }
    if v <= i64::MAX as u64 + 1 {
        Some(Value::from((v as i64).wrapping_neg()))
    } else {
        None
    }
}

/// The console's help text.
pub const HELP: &str = "\
Type a call as in Tarantool's console; its results are printed as JSON.
  queue.put('hello')                 put a task (any literal: 'x', 42, {a=1}, {1,2}, true, nil)
  queue.put({job=7}, {delay=1.5, pri=-1, ttl=60, ttr=30})
  queue.take()  queue.take(5)        take a task, or wait up to 5 s for one
  queue.ack(1)  queue.release(1)  queue.release(1, {delay=10})
  queue.stats()
  help, quit (or Ctrl-D)";

/// Runs the interactive console against `cluster` until `quit` or end of input.
pub fn run(cluster: &mut Cluster, history: Option<PathBuf>) -> anyhow::Result<()> {
    let mut editor = DefaultEditor::with_config(
        rustyline::Config::builder()
            .max_history_size(HISTORY_LINES)?
            .auto_add_history(true)
            .build(),
    )?;
    let history =
        history.or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(HISTORY_FILE)));
    if let Some(path) = &history {
        // A first run has no history yet; anything else wrong with it is not worth stopping.
        let _ = editor.load_history(path);
    }
    loop {
        // The node in use, which a redirect or a failover changes.
        let prompt = format!("{}> ", cluster.addr().unwrap_or("?"));
        let line = match editor.readline(&prompt) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        };
        match parse_line(&line) {
            Ok(Line::Empty) => {}
            Ok(Line::Quit) => break,
            Ok(Line::Help) => println!("{HELP}"),
            Ok(Line::Call { function, args }) => {
                let wait = take_wait(&function, &args);
                let mut packed = Vec::new();
                rmpv::encode::write_value(&mut packed, &Value::Array(args))
                    .expect("writing to a Vec cannot fail");
                match cluster.call(&function, &packed, wait, Effect::of(&function)) {
                    Ok(values) => println!("{}", super::to_json_pretty(&Value::Array(values))),
                    Err(e) => match e.server() {
                        Some((code, message)) => println!("error: {message} (code {code})"),
                        // The next line reconnects: the console goes on.
                        None if matches!(
                            e,
                            ClusterError::LostDuringChange { .. }
                                | ClusterError::TooManyRedirects { .. }
                        ) =>
                        {
                            println!("error: {e}")
                        }
                        None => {
                            eprintln!("error: {e}");
                            break;
                        }
                    },
                }
            }
            Err(e) => println!("error: {e}"),
        }
    }
    if let Some(path) = &history {
        if let Err(e) = editor.save_history(path) {
            eprintln!("warning: history not saved to {}: {e}", path.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(function: &str, args: Vec<Value>) -> Line {
        Line::Call {
            function: function.into(),
            args,
        }
    }

    fn s(v: &str) -> Value {
        Value::from(v)
    }

    fn map(pairs: Vec<(Value, Value)>) -> Value {
        Value::Map(pairs)
    }

    #[test]
    fn calls_parse() {
        let cases: Vec<(&str, Line)> = vec![
            ("queue.put('x')", call("queue.put", vec![s("x")])),
            ("  queue.take()  ", call("queue.take", vec![])),
            (
                "queue.take(1.5);",
                call("queue.take", vec![Value::F64(1.5)]),
            ),
            ("return queue.stats()", call("queue.stats", vec![])),
            ("queue.ack(42)", call("queue.ack", vec![Value::from(42u64)])),
            ("queue.ack('42')", call("queue.ack", vec![s("42")])),
            (
                "queue.tube.jobs:put('x')",
                call("queue.tube.jobs:put", vec![s("x")]),
            ),
            (
                "queue.put(\"a\\tb\\\"c\\65\\x42\", {delay = 2, pri=-3})",
                call(
                    "queue.put",
                    vec![
                        s("a\tb\"cAB"),
                        map(vec![
                            (s("delay"), Value::from(2u64)),
                            (s("pri"), Value::from(-3i64)),
                        ]),
                    ],
                ),
            ),
            (
                "queue.put({1, 'two', {3}, {}})",
                call(
                    "queue.put",
                    vec![Value::Array(vec![
                        Value::from(1u64),
                        s("two"),
                        Value::Array(vec![Value::from(3u64)]),
                        map(vec![]),
                    ])],
                ),
            ),
            (
                "queue.put({['k y']=true; n=nil, 'pos'})",
                call(
                    "queue.put",
                    vec![map(vec![
                        (Value::from(1u64), s("pos")),
                        (s("k y"), Value::Boolean(true)),
                        (s("n"), Value::Nil),
                    ])],
                ),
            ),
            (
                "queue.put(nil, box.NULL, false, -0x10, 1e3, -2.5e-1, .5)",
                call(
                    "queue.put",
                    vec![
                        Value::Nil,
                        Value::Nil,
                        Value::Boolean(false),
                        Value::from(-16i64),
                        Value::F64(1000.0),
                        Value::F64(-0.25),
                        Value::F64(0.5),
                    ],
                ),
            ),
            (
                "queue.put([[raw \\n 'x']], [==[a]]b]==])",
                call("queue.put", vec![s("raw \\n 'x'"), s("a]]b")]),
            ),
            ("queue.put'sugar'", call("queue.put", vec![s("sugar")])),
            (
                "queue.put{a=1}",
                call("queue.put", vec![map(vec![(s("a"), Value::from(1u64))])]),
            ),
            (
                "queue.put(18446744073709551615, -9223372036854775808)",
                call(
                    "queue.put",
                    vec![Value::from(u64::MAX), Value::from(i64::MIN)],
                ),
            ),
            (
                "queue.put('é') -- a comment",
                call("queue.put", vec![s("é")]),
            ),
            ("", Line::Empty),
            ("   -- only a comment", Line::Empty),
            ("quit", Line::Quit),
            ("\\q", Line::Quit),
            ("exit;", Line::Quit),
            ("help", Line::Help),
        ];
        for (input, want) in cases {
            assert_eq!(parse_line(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn bad_lines_say_where_and_why() {
        let cases = [
            ("queue.put('x'", 14, "expected ',' or ')'"),
            ("queue.put('x)", 11, "unfinished string"),
            ("queue.put(x)", 11, "'x' is not a literal"),
            ("queue.put", 10, "expected '('"),
            ("queue.put('a') b", 16, "unexpected text"),
            ("42", 1, "expected a function name"),
            ("queue.", 7, "expected a name after '.'"),
            ("queue.put({a=})", 14, "unexpected '}'"),
            ("queue.put({1 2})", 14, "expected ',' or '}'"),
            ("queue.put(99999999999999999999)", 11, "number out of range"),
            ("queue.put(-9223372036854775809)", 11, "number out of range"),
            ("queue.put('\\q')", 13, "unknown escape \\q"),
            ("queue.put('\\300')", 15, "above 255"),
            ("queue.put({[nil]=1})", 13, "cannot be nil"),
            ("queue.put([=[x]])", 11, "unfinished long string"),
            ("queue.put(-)", 11, "expected a number"),
        ];
        for (input, column, message) in cases {
            let e = parse_line(input).unwrap_err();
            assert!(
                e.message.contains(message) && e.column == column,
                "{input}: got {e}, want column {column}: {message}"
            );
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("f({}{})", "{".repeat(MAX_NESTING), "}".repeat(MAX_NESTING));
        assert!(parse_line(&ok).is_ok());
        let deep = format!("f({}{})", "{".repeat(100_000), "}".repeat(100_000));
        let e = parse_line(&deep).unwrap_err();
        assert!(e.message.contains("nested deeper than 64"), "{e}");
    }
}
