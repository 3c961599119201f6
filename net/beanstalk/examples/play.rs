//! Plays byte scripts (`tests/scripts/*.bs`) against any beanstalk server and prints the
//! normalised transcripts, to compare with the recordings made against real beanstalkd:
//! `cargo run -p tarq-beanstalk --example play -- 127.0.0.1:11300 net/beanstalk/tests/scripts/worker.bs`.
//! Each script expects a fresh server (ids, tube lists and counters start from nothing).

#[path = "../tests/support/script.rs"]
mod script;

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args.next().expect("usage: play ADDR SCRIPT...");
    for path in args {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let steps = script::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        print!("{}", script::play(&addr, &steps));
    }
}
