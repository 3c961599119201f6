//! What the sharded tests share: tube `jobs` of two partitions made through one node and
//! known to all, who owns which partition, `tarq.move` asked until a primary takes it, and
//! calls that panic with the function's name.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::time::Duration;

use rmpv::Value;
use tarq_client::{pack_args, Client};

use super::cluster::{field, str_field, wait_for};

pub fn connect(addr: SocketAddr) -> Client {
    Client::connect_addr(addr, Duration::from_secs(20)).expect("connect")
}

pub fn call(c: &mut Client, f: &str, args: &[Value]) -> Vec<Value> {
    c.call(f, &pack_args(args), None)
        .unwrap_or_else(|e| panic!("{f}: {e}"))
}

/// The id of the task a tube call answered, if it answered one.
pub fn task_id(values: &[Value]) -> Option<u64> {
    values.first()?.as_array()?.first()?.as_u64()
}

/// The owning set of each partition of `tube`, as node `addr` sees the placement.
/// Waits until the node sees the tube placed: a `create_tube` answers once etcd has it, and a
/// node applies the placement that has it a moment later.
pub fn owners(addr: SocketAddr, tube: &str) -> Vec<String> {
    let mut c = connect(addr);
    let mut found = None;
    wait_for(&format!("node {addr} to see tube {tube} placed"), || {
        let o = call(&mut c, "queue.cluster", &[]).remove(0);
        let tubes = field(field(&o, "placement").unwrap(), "tubes").unwrap();
        found = (tubes.as_array().unwrap().iter())
            .find(|t| str_field(t, "name") == tube)
            .map(|t| {
                let parts = field(t, "partitions").unwrap().as_array().unwrap();
                parts.iter().map(|p| str_field(p, "set")).collect()
            });
        found.is_some()
    });
    found.expect("waited for")
}

/// Tube `jobs`, fifottl of two partitions, made through `addr` and known to every node at
/// `all`.
pub fn make_jobs(addr: SocketAddr, all: impl IntoIterator<Item = SocketAddr>) {
    let opts = Value::Map(vec![(Value::from("partitions"), Value::from(2))]);
    let args = [Value::from("jobs"), Value::from("fifottl"), opts];
    call(&mut connect(addr), "queue.create_tube", &args);
    for n in all {
        let mut c = connect(n);
        wait_for("every node to know the tube", || {
            c.call("queue.statistics", &pack_args(&[Value::from("jobs")]), None)
                .is_ok()
        });
    }
}

/// `tarq.move` of partition `part` of `jobs` to set `to` through `addr`: its report. A refusal
/// with code 32 did nothing (a node that may not lead this moment) and is asked again.
pub fn move_jobs(addr: SocketAddr, part: u64, to: &str) -> serde_json::Value {
    let mut c = connect(addr);
    let args = pack_args(&[Value::from("jobs"), Value::from(part), Value::from(to)]);
    let mut report = None;
    wait_for("the partition to move", || {
        match c.call("tarq.move", &args, None) {
            Ok(r) => {
                report = Some(r[0].as_str().expect("a report").to_owned());
                true
            }
            Err(tarq_client::ClientError::Server { code: 32, .. }) => false,
            Err(e) => panic!("tarq.move: {e}"),
        }
    });
    serde_json::from_str(&report.unwrap()).unwrap()
}
