//! The null IPROTO server of issue 40's io_uring question (`tarq_benches::null_io`): answers
//! every CALL at once with an empty result, as `tarq --null`, over an epoll loop or an
//! io_uring one. Prints `listening on ADDR` once it accepts (so `--listen 127.0.0.1:0` works:
//! read the port there), then serves until killed.
//!
//! ```sh
//! null_io --listen 127.0.0.1:3301 --io uring --multishot --cpu 0
//! null_io --probe          # what this kernel offers of io_uring; exits 1 if nothing
//! ```
//!
//! Flags: `--listen ADDR` (127.0.0.1:3301), `--io epoll|uring` (uring), `--multishot`
//! (multishot recv with provided buffers), `--sqpoll IDLE_MS` (SQPOLL, its thread idle this
//! long before it sleeps), `--sqpoll-cpu N` (pin that thread), `--cpu N` (pin the loop).

use std::net::TcpListener;

use tarq_benches::null_io::{self, Io, UringOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--probe") {
        match null_io::uring::probe() {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => fail(&format!("io_uring unavailable: {e}")),
        }
        return;
    }
    let value = |flag: &str| {
        let at = args.iter().position(|a| a == flag)?;
        Some(
            args.get(at + 1)
                .unwrap_or_else(|| fail(&format!("{flag} needs a value"))),
        )
    };
    let number = |flag: &str| {
        value(flag).map(|v| {
            v.parse::<u32>()
                .unwrap_or_else(|_| fail(&format!("{flag}: not a number: {v}")))
        })
    };
    let io = match value("--io").map(String::as_str).unwrap_or("uring") {
        "epoll" => Io::Epoll,
        "uring" => Io::Uring(UringOptions {
            multishot: args.iter().any(|a| a == "--multishot"),
            sqpoll_idle_ms: number("--sqpoll"),
            sqpoll_cpu: number("--sqpoll-cpu"),
        }),
        other => fail(&format!("--io epoll|uring, not {other}")),
    };
    if let Some(cpu) = number("--cpu") {
        tarq_affinity::pin(cpu as usize).unwrap_or_else(|e| fail(&e.to_string()));
    }
    let listen = value("--listen").map_or("127.0.0.1:3301", String::as_str);
    let listener = TcpListener::bind(listen).unwrap_or_else(|e| fail(&format!("{listen}: {e}")));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| fail(&e.to_string()));
    println!("listening on {addr} ({io:?})");
    if let Err(e) = null_io::serve(listener, io) {
        fail(&format!("the loop failed: {e}"));
    }
}

fn fail(why: &str) -> ! {
    eprintln!("null_io: {why}");
    #[allow(clippy::exit)] // a tool's error exit, after its message
    std::process::exit(1)
}
