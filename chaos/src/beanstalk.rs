//! A small blocking beanstalk client for the workload: the commands it needs (`use`, `watch`,
//! `ignore`, `put`, `reserve-with-timeout`, `delete`, `release`, `bury`) over one TCP connection with
//! a read timeout, each reply read whole. tarq's beanstalk port answers a change sent to a
//! replica with `READ_ONLY <primary>` (beanstalkd has no such reply) and an open outcome by
//! `INTERNAL_ERROR` or by closing the connection; the caller maps those to the history's
//! kinds.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One connection, watching and using one tube.
pub struct Beanstalk {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

/// A reply: its first line's words, and the body that followed (for `RESERVED`).
#[derive(Debug)]
pub struct Reply {
    pub words: Vec<String>,
    pub body: Option<Vec<u8>>,
}

impl Reply {
    pub fn is(&self, word: &str) -> bool {
        self.words.first().is_some_and(|w| w == word)
    }

    /// The number at `at` (an id), if it is one.
    pub fn number(&self, at: usize) -> Option<u64> {
        self.words.get(at)?.parse().ok()
    }

    pub fn line(&self) -> String {
        self.words.join(" ")
    }
}

impl Beanstalk {
    /// Connects and switches to `tube` for both puts and reserves.
    pub fn connect(addr: SocketAddr, tube: &str, timeout: Duration) -> io::Result<Beanstalk> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut b = Beanstalk {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        for (command, want) in [
            (format!("use {tube}"), "USING"),
            (format!("watch {tube}"), "WATCHING"),
            ("ignore default".to_owned(), "WATCHING"),
        ] {
            let r = b.command(command.as_bytes(), None)?;
            if !r.is(want) {
                return Err(io::Error::other(format!("{command}: {}", r.line())));
            }
        }
        Ok(b)
    }

    /// Sends `line` (and `body`, if any) and reads the reply.
    pub fn command(&mut self, line: &[u8], body: Option<&[u8]>) -> io::Result<Reply> {
        let mut out = line.to_vec();
        out.extend_from_slice(b"\r\n");
        if let Some(body) = body {
            out.extend_from_slice(body);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out)?;
        self.read_reply()
    }

    fn read_reply(&mut self) -> io::Result<Reply> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ));
        }
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let body = if words.first().is_some_and(|w| w == "RESERVED") {
            let len: usize = words
                .get(2)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| io::Error::other(format!("bad reply {line:?}")))?;
            let mut body = vec![0; len + 2];
            io::Read::read_exact(&mut self.reader, &mut body)?;
            body.truncate(len);
            Some(body)
        } else {
            None
        };
        Ok(Reply { words, body })
    }

    pub fn put(&mut self, body: &[u8], ttr_secs: u64) -> io::Result<Reply> {
        let line = format!("put 1024 0 {ttr_secs} {}", body.len());
        self.command(line.as_bytes(), Some(body))
    }

    pub fn reserve(&mut self, timeout_secs: u64) -> io::Result<Reply> {
        self.command(
            format!("reserve-with-timeout {timeout_secs}").as_bytes(),
            None,
        )
    }

    pub fn delete(&mut self, id: u64) -> io::Result<Reply> {
        self.command(format!("delete {id}").as_bytes(), None)
    }

    pub fn release(&mut self, id: u64) -> io::Result<Reply> {
        self.command(format!("release {id} 1024 0").as_bytes(), None)
    }

    pub fn bury(&mut self, id: u64) -> io::Result<Reply> {
        self.command(format!("bury {id} 1024").as_bytes(), None)
    }
}
