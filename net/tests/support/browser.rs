//! A headless chromium for the console's tests: Debian's `chromium` driven through
//! `chromedriver` (WebDriver; nothing downloads a browser), with the console's credentials on
//! every request the page makes. Without the browser a test says what it skipped; under
//! `CI=true` a missing browser fails it (`.ci/test` installs both).
#![allow(dead_code)] // each test binary uses a different part

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value as Json};

use crate::support::{read_http_response, Lines, Proc, WAIT};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Whether the browser is here; `false` (with a line saying what is skipped) when it is not,
/// a failure under `CI=true`.
pub fn browser_present(test: &str) -> bool {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{test}: skipped, {} not installed (apt-get install chromium chromium-driver)",
        missing.join(" and ")
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("{why}");
    false
}

/// A WebDriver session in a headless chromium, its driver killed on drop.
pub struct Browser {
    driver: SocketAddr,
    session: String,
    _proc: Proc,
    _profile: tempfile::TempDir,
    /// The home whose NSS database trusts a test CA (`start_trusting`).
    _home: Option<tempfile::TempDir>,
}

pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&Json>) -> Json {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let got = read_http_response(&mut s);
    let text = String::from_utf8_lossy(&got);
    let (_, body) = text.split_once("\r\n\r\n").unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{method} {path}: {e}: {text}"))
}

impl Browser {
    pub fn start(basic: &str) -> Browser {
        Browser::launch(basic, None)
    }

    /// A browser that trusts the CA certificate `ca` (PEM) as an operator's would once it is
    /// added to the system's store: chromium on Linux reads `$HOME/.pki/nssdb`, so it runs
    /// with a home of its own whose NSS database holds the CA (made with `certutil`, Debian's
    /// `libnss3-tools`). Nothing else is trusted or ignored.
    pub fn start_trusting(basic: &str, ca: &std::path::Path) -> Browser {
        let home = tempfile::tempdir().unwrap();
        let db = home.path().join(".pki/nssdb");
        std::fs::create_dir_all(&db).unwrap();
        let db = format!("sql:{}", db.display());
        let certutil = |args: &[&str]| {
            let out = Command::new("certutil")
                .args(args)
                .output()
                .expect("certutil (Debian package libnss3-tools) runs");
            assert!(
                out.status.success(),
                "certutil {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        certutil(&["-N", "-d", &db, "--empty-password"]);
        let ca = ca.to_str().unwrap();
        certutil(&["-A", "-d", &db, "-n", "tarq test CA", "-t", "C,,", "-i", ca]);
        Browser::launch(basic, Some(home))
    }

    fn launch(basic: &str, home: Option<tempfile::TempDir>) -> Browser {
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(home) = &home {
            cmd.env("HOME", home.path());
        }
        let mut proc = Proc::spawn(&mut cmd);
        let mut lines = Lines::read(proc.0.stdout.take().unwrap());
        let line = lines.wait_for("started successfully on port", WAIT);
        let port: u16 = line
            .rsplit(' ')
            .next()
            .and_then(|p| p.trim_end_matches('.').parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        let driver: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1000", "--no-first-run",
                         format!("--user-data-dir={}", profile.path().display())],
            }
        }}});
        let v = http(driver, "POST", "/session", Some(&caps));
        let session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        let b = Browser {
            driver,
            session,
            _proc: proc,
            _profile: profile,
            _home: home,
        };
        // The console's credentials on every request the page makes (HTTP Basic).
        b.cmd(
            "POST",
            "goog/cdp/execute",
            json!({"cmd": "Network.enable", "params": {}}),
        );
        b.cmd(
            "POST",
            "goog/cdp/execute",
            json!({"cmd": "Network.setExtraHTTPHeaders", "params": {"headers": {"Authorization": format!("Basic {basic}")}}}),
        );
        b
    }

    pub fn cmd(&self, method: &str, what: &str, body: Json) -> Json {
        let path = format!("/session/{}/{what}", self.session);
        let v = http(
            self.driver,
            method,
            &path,
            (method == "POST").then_some(&body),
        );
        assert!(v["value"].get("error").is_none(), "{what}: {v}");
        v["value"].clone()
    }

    pub fn open(&self, url: &str) {
        self.cmd("POST", "url", json!({ "url": url }));
    }

    pub fn script(&self, js: &str) -> Json {
        self.cmd("POST", "execute/sync", json!({"script": js, "args": []}))
    }

    /// Waits until `js` returns a truthy value; returns it.
    pub fn until(&self, what: &str, js: &str) -> Json {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self.script(js);
            if !(v.is_null() || v == false || v == "" || v == 0) {
                return v;
            }
            assert!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(50)); // a page has no event a test can wait on
        }
    }

    pub fn click(&self, css: &str) {
        let v = self.cmd(
            "POST",
            "element",
            json!({"using": "css selector", "value": css}),
        );
        let id = v
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Json::as_str)
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_owned();
        self.cmd("POST", &format!("element/{id}/click"), json!({}));
    }

    /// A screenshot of the page, written to `path`.
    pub fn screenshot(&self, path: &std::path::Path) {
        let v = self.cmd("GET", "screenshot", json!(null));
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = std::panic::catch_unwind(|| http(self.driver, "DELETE", &path, None));
    }
}
