//! The TCP ports a process listens on, read from Linux's `/proc`: the socket inodes among the
//! process's open files (`/proc/<pid>/fd/* -> socket:[inode]`) matched against the rows of its
//! network namespace's tables (`/proc/<pid>/net/tcp` and `tcp6`) in the LISTEN state. It lets a
//! test start a server that cannot say which port it got (beanstalkd `-p 0`, Tarantool
//! `listen = '127.0.0.1:0'`) and learn the port from the kernel, and check that a server
//! started on a chosen port is the one listening there, instead of picking a free port,
//! releasing it and hoping nobody else takes it first.
//!
//! [`Refusing`] holds a port without listening: an address that refuses connections, or, with
//! SO_REUSEADDR, a port kept for a server that must come back on a known port (a node
//! advertised in etcd) or cannot bind port 0 (carbon, Redis, etcd).

use std::collections::HashSet;
use std::io;

/// The state column of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";

/// The ports `pid` listens on (IPv4 and IPv6, sorted, each once). Empty while it has not
/// bound yet; an error once it is gone.
pub fn listening_ports(pid: u32) -> io::Result<Vec<u16>> {
    let inodes = socket_inodes(pid)?;
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = match std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) {
            Ok(t) => t,
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if e.kind() == io::ErrorKind::NotFound && table == "tcp6" => continue,
            Err(e) => return Err(e),
        };
        // Columns: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
        for row in text.lines().skip(1) {
            let cols: Vec<&str> = row.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (cols.get(1), cols.get(3), cols.get(9))
            else {
                continue;
            };
            if *state != TCP_LISTEN || !inode.parse().is_ok_and(|i: u64| inodes.contains(&i)) {
                continue;
            }
            let port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if let Some(port) = port {
                ports.push(port);
            }
        }
    }
    ports.sort_unstable();
    ports.dedup();
    Ok(ports)
}

/// True when `pid` is listening on `port` right now.
pub fn listens_on(pid: u32, port: u16) -> bool {
    listening_ports(pid).is_ok_and(|ports| ports.contains(&port))
}

/// A loopback address that refuses connections for as long as this lives: a socket bound to
/// a port of its own that never listens. Holding the port keeps every other process from
/// listening there meanwhile, which a port bound and released could not.
pub struct Refusing {
    pub addr: std::net::SocketAddr,
    socket: socket2::Socket,
}

impl Refusing {
    pub fn open() -> Refusing {
        Refusing::bind(false)
    }

    /// An address held for a server that binds it itself, with SO_REUSEADDR as tarq, etcd and
    /// Redis do, and may die and come back on it (a node advertised in etcd): the server can
    /// listen there while this holds it, and nobody else gets the port meanwhile (the kernel's
    /// choice for port 0 skips it; a bind without SO_REUSEADDR fails).
    pub fn reserve() -> Refusing {
        Refusing::bind(true)
    }

    fn bind(reuse: bool) -> Refusing {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        if reuse {
            socket.set_reuse_address(true).expect("SO_REUSEADDR");
        }
        let any_port = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
        socket.bind(&any_port.into()).expect("bind");
        let addr = socket
            .local_addr()
            .expect("getsockname")
            .as_socket()
            .expect("an IPv4 address");
        Refusing { addr, socket }
    }

    /// Starts listening on the address: a server that was down comes up on the same port,
    /// which nobody could take meanwhile.
    pub fn listen(self) -> std::net::TcpListener {
        self.socket.listen(128).expect("listen");
        self.socket.into()
    }
}

/// The inodes of the sockets among `pid`'s open files.
fn socket_inodes(pid: u32) -> io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A file closed between the listing and the readlink is simply not there.
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
            .and_then(|t| t.parse().ok())
        {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_of_this_process_is_found_and_a_closed_one_is_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        assert!(listens_on(std::process::id(), port));
        drop(l);
        assert!(!listens_on(std::process::id(), port));
    }

    #[test]
    fn a_refusing_address_refuses_and_a_reserved_port_takes_its_server_again_and_again() {
        use std::io::ErrorKind::ConnectionRefused;
        use std::net::{TcpListener, TcpStream};
        let dead = Refusing::open();
        let refused = |addr| TcpStream::connect(addr).unwrap_err().kind() == ConnectionRefused;
        assert!(refused(dead.addr));
        let held = Refusing::reserve();
        assert!(refused(held.addr));
        for _ in 0..2 {
            // std's listener sets SO_REUSEADDR, as tarq's, etcd's and Redis's do.
            let server = TcpListener::bind(held.addr).unwrap();
            TcpStream::connect(held.addr).unwrap();
            drop(server);
            assert!(refused(held.addr));
        }
        let addr = held.addr;
        let listener = held.listen();
        TcpStream::connect(addr).unwrap();
        drop(listener);
    }
}
