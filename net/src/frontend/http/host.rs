//! Which `Host` the HTTP port answers (DNS rebinding): a page on another site whose name
//! the attacker then points at this tarq's address is, to the browser, of that site, so it may
//! read the console's answers; its requests still carry that site's name in `Host`. So a
//! request is served when its `Host` is one of the names the operator gave (`--http-host`), an
//! IP address, or a name no public DNS can hand out (one without a dot, such as `localhost` or
//! an intranet short name, or one under `.localhost`). Any other name is refused — on a
//! loopback port always, elsewhere once names are given (without them every name is served,
//! and the start warns). The port of `Host` plays no part: rebinding keeps the port.

use std::net::IpAddr;

/// The names the HTTP port answers, from `--http-host`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hosts {
    /// Lower-case, without a port.
    names: Vec<String>,
    /// Any name is served: the port is not on a loopback address and no name was given.
    any: bool,
}

impl Hosts {
    /// The names for a port on `listen`, as given (`name` or `name:port`, any case).
    pub fn new(names: &[String], listen_loopback: bool) -> Hosts {
        let names: Vec<String> = names
            .iter()
            .map(|n| host_only(n.trim()).to_ascii_lowercase())
            .filter(|n| !n.is_empty())
            .collect();
        Hosts {
            any: names.is_empty() && !listen_loopback,
            names,
        }
    }

    /// Whether every name is served (the start says so).
    pub fn any(&self) -> bool {
        self.any
    }

    /// `None` when a request with this `Host` header (`None`: no header, an HTTP/1.0
    /// client) is served, else why not.
    pub fn refusal(&self, host: Option<&[u8]>) -> Option<String> {
        let raw = host?;
        let Ok(text) = std::str::from_utf8(raw) else {
            return Some("the Host header is not text".into());
        };
        let name = host_only(text.trim()).to_ascii_lowercase();
        let served = self.any
            || unresolvable(&name)
            || name.trim_matches(['[', ']']).parse::<IpAddr>().is_ok()
            || self.names.contains(&name);
        (!served).then(|| {
            format!(
                "Host {name} is not a name of this tarq: a page of another site may be reaching \
                 it through DNS; if it is this tarq's name, add it to http-host"
            )
        })
    }
}

/// `host` without its port (`[::1]:80` → `[::1]`, `a:80` → `a`; a bare IPv6 address kept).
fn host_only(host: &str) -> &str {
    if host.starts_with('[') {
        return host.split_inclusive(']').next().unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// A name public DNS cannot answer for: one label, or under `.localhost` (which browsers
/// resolve to the loopback themselves).
fn unresolvable(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    !name.contains('.') || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(h: &Hosts, host: &str) -> bool {
        h.refusal(Some(host.as_bytes())).is_none()
    }

    #[test]
    fn a_loopback_port_serves_addresses_and_local_names_only_unless_named() {
        let h = Hosts::new(&[], true);
        for ok in [
            "localhost:9100",
            "127.0.0.1:9100",
            "[::1]:9100",
            "::1",
            "x",
            "app.localhost",
            "10.1.2.3",
        ] {
            assert!(served(&h, ok), "{ok}");
        }
        for bad in ["evil.example:9100", "evil.example", "tarq.internal.corp"] {
            let why = h.refusal(Some(bad.as_bytes())).expect(bad);
            assert!(why.contains("http-host"), "{why}");
        }
        assert!(h.refusal(None).is_none(), "no Host: an HTTP/1.0 client");
        assert!(h.refusal(Some(b"\xff")).is_some());
    }

    #[test]
    fn named_hosts_are_served_in_any_case_and_with_any_port() {
        let h = Hosts::new(&["Tarq.Example.com:443".into(), " q.corp ".into()], false);
        assert!(!h.any());
        assert!(served(&h, "tarq.example.COM"));
        assert!(served(&h, "tarq.example.com:9100"));
        assert!(served(&h, "q.corp"));
        assert!(!served(&h, "evil.example"));
    }

    #[test]
    fn a_port_elsewhere_without_names_serves_any() {
        let h = Hosts::new(&[], false);
        assert!(h.any());
        assert!(served(&h, "whatever.example"));
    }
}
