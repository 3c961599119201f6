//! Criterion benches of the engine's operations, each at 0, 100k and 1M resident tasks, side
//! by side with the `BTreeMap` baseline (`tarq_benches::baseline`): put; take+ack; the full
//! put->take->ack cycle; release back into a deep ready list (landing mid-list by pri);
//! one bounded `advance` step while 1M tasks are due. After criterion, a plain timed drain of
//! 1M due tasks in bounded steps records the worst single step. Tubes: a put into a fifottl
//! tube against a put into `default`, and a utube take+ack while 10 to 100k other utubes are
//! busy (each holds a taken task with another waiting behind it), with its per-operation
//! percentiles from a plain timed loop. Everything lands in
//! `results/engine/<date>-<commit>.json` (see `results/README.md` for the command).
//!
//! Resident tasks stay resident: each timed batch is followed by an untimed one that undoes
//! it (puts are taken and acked, takes are put back), so every sample sees the same size.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use serde_json::{json, Value};
use tarq_benches::baseline::Baseline;
use tarq_benches::report;
use tarq_engine::{PutOptions, Queue, Status, TubeOptions, TubePut, TubeType};

/// Resident task counts every bench runs at.
const SIZES: [usize; 3] = [0, 100_000, 1_000_000];
/// Operations per timed batch before the untimed batch that restores the resident count:
/// large enough that the timer's own cost (~25 ns) vanishes, small next to the sizes.
const CHUNK: u64 = 10_000;
/// Tasks held taken and released in one batch of the release bench.
const WORK: usize = 1024;
/// Deadlines one `advance` step may handle in the criterion bench: the server's loop budget.
const ADVANCE_BUDGET: usize = tarq_net::server::ADVANCE_BUDGET;
/// Budgets the timed drain compares: the server's (512, chosen from this drain: its worst
/// cold step stays near half a millisecond), and twice it.
const DRAIN_BUDGETS: [usize; 2] = [ADVANCE_BUDGET, 2 * ADVANCE_BUDGET];
/// Due tasks in the advance benches.
const EXPIRING: usize = 1_000_000;
/// Ready-list priorities in the release bench are spread over this many values.
const PRI_SPREAD: u64 = 1024;
const T0: u64 = 1_700_000_000_000_000;
const SID: u64 = 1;

/// Busy utubes in the utube take bench: the flat-latency claim is from 10 to 100k.
const BUSY_UTUBES: [usize; 3] = [10, 1_000, 100_000];
/// Timed take+ack pairs per size in the percentile loop.
const UTUBE_SAMPLES: usize = 200_000;

/// A 6-byte MessagePack string, as a client's `'hello'` arrives.
fn payload() -> Box<[u8]> {
    Box::from(&b"\xa5hello"[..])
}

fn ttl_opts(ttl: u64) -> PutOptions {
    PutOptions {
        ttl: Some(ttl),
        ..Default::default()
    }
}

fn engine_with(n: usize) -> Queue {
    let mut q = Queue::new();
    for _ in 0..n {
        q.put(T0, payload(), PutOptions::default());
    }
    q
}

fn baseline_with(n: usize) -> Baseline {
    let mut b = Baseline::new();
    for _ in 0..n {
        b.put(T0, payload(), 0, None);
    }
    b
}

/// Runs `iters` timed operations in batches of CHUNK, each followed by an untimed `undo`.
fn batched<Q>(
    q: &mut Q,
    iters: u64,
    mut timed: impl FnMut(&mut Q, u64),
    mut undo: impl FnMut(&mut Q, u64),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        let t = Instant::now();
        timed(q, n);
        total += t.elapsed();
        undo(q, n);
        left -= n;
    }
    total
}

fn bench_put(c: &mut Criterion) {
    let mut g = c.benchmark_group("put");
    for &n in &SIZES {
        let mut q = engine_with(n);
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter_custom(|iters| {
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            black_box(q.put(T0, payload(), PutOptions::default()).id);
                        }
                    },
                    |q, k| {
                        for _ in 0..k {
                            let id = q.take(T0, SID).expect("ready").id;
                            q.ack(SID, id).expect("owned");
                        }
                    },
                )
            })
        });
        drop(q);
        let mut q = baseline_with(n);
        g.bench_with_input(BenchmarkId::new("btreemap", n), &n, |b, _| {
            b.iter_custom(|iters| {
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            black_box(q.put(T0, payload(), 0, None));
                        }
                    },
                    |q, k| {
                        for _ in 0..k {
                            let id = q.take(SID).expect("ready");
                            assert!(q.ack(SID, id));
                        }
                    },
                )
            })
        });
    }
    g.finish();
}

fn bench_take_ack(c: &mut Criterion) {
    let mut g = c.benchmark_group("take_ack");
    for &n in &SIZES {
        let mut q = engine_with(n);
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter_custom(|iters| {
                // Untimed first: k tasks to take on top of the resident ones.
                for _ in 0..iters.min(CHUNK) {
                    q.put(T0, payload(), PutOptions::default());
                }
                let mut left = iters;
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            let id = q.take(T0, SID).expect("ready").id;
                            black_box(q.ack(SID, id).expect("owned"));
                        }
                    },
                    |q, k| {
                        left -= k;
                        for _ in 0..left.min(CHUNK) {
                            q.put(T0, payload(), PutOptions::default());
                        }
                    },
                )
            })
        });
        drop(q);
        let mut q = baseline_with(n);
        g.bench_with_input(BenchmarkId::new("btreemap", n), &n, |b, _| {
            b.iter_custom(|iters| {
                for _ in 0..iters.min(CHUNK) {
                    q.put(T0, payload(), 0, None);
                }
                let mut left = iters;
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            let id = q.take(SID).expect("ready");
                            black_box(q.ack(SID, id));
                        }
                    },
                    |q, k| {
                        left -= k;
                        for _ in 0..left.min(CHUNK) {
                            q.put(T0, payload(), 0, None);
                        }
                    },
                )
            })
        });
    }
    g.finish();
}

fn bench_cycle(c: &mut Criterion) {
    let mut g = c.benchmark_group("cycle");
    for &n in &SIZES {
        let mut q = engine_with(n);
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter(|| {
                q.put(T0, payload(), PutOptions::default());
                let id = q.take(T0, SID).expect("ready").id;
                black_box(q.ack(SID, id).expect("owned"));
            })
        });
        drop(q);
        let mut q = baseline_with(n);
        g.bench_with_input(BenchmarkId::new("btreemap", n), &n, |b, _| {
            b.iter(|| {
                q.put(T0, payload(), 0, None);
                let id = q.take(SID).expect("ready");
                black_box(q.ack(SID, id));
            })
        });
    }
    g.finish();
}

/// A put into a fifottl tube against the seed put into `default`, at each resident size.
fn bench_put_tube(c: &mut Criterion) {
    let mut g = c.benchmark_group("put_tube");
    for &n in &SIZES {
        let mut q = engine_with(n);
        let t = q
            .create_tube("q", TubeType::FifoTtl, TubeOptions::default())
            .expect("new tube");
        g.bench_with_input(BenchmarkId::new("default", n), &n, |b, _| {
            b.iter_custom(|iters| {
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            black_box(q.put(T0, payload(), PutOptions::default()).id);
                        }
                    },
                    |q, k| undo_puts(q, 0, k),
                )
            })
        });
        g.bench_with_input(BenchmarkId::new("tube", n), &n, |b, _| {
            b.iter_custom(|iters| {
                batched(
                    &mut q,
                    iters,
                    |q, k| {
                        for _ in 0..k {
                            black_box(q.put_in(T0, t, payload(), TubePut::default()).is_ok());
                        }
                    },
                    |q, k| undo_puts(q, t, k),
                )
            })
        });
    }
    g.finish();
}

/// Deletes the `k` newest tasks (the timed batch's puts into tube `t`: ids are consecutive).
fn undo_puts(q: &mut Queue, t: u16, k: u64) {
    let last = q.last_id();
    for id in last - k + 1..=last {
        q.delete(t, id).expect("put in this batch");
    }
}

/// A utube tube with `busy` utubes each holding a taken task and a ready one behind it.
fn busy_utubes(busy: usize) -> (Queue, u16) {
    let mut q = Queue::new();
    let t = q
        .create_tube("u", TubeType::Utube, TubeOptions::default())
        .expect("new tube");
    for i in 0..busy {
        let key = (i as u64).to_le_bytes();
        for _ in 0..2 {
            let p = TubePut {
                utube: &key,
                ..TubePut::default()
            };
            q.put_in(T0, t, payload(), p).expect("put");
        }
        q.take_from(T0, t, SID).expect("tube").expect("head");
    }
    assert!(!q.can_take(t), "every utube is busy");
    (q, t)
}

/// One put, take, ack on a free utube of tube `t` (where every other utube is busy).
fn utube_cycle(q: &mut Queue, t: u16) {
    let p = TubePut {
        utube: b"free",
        ..TubePut::default()
    };
    q.put_in(T0, t, payload(), p).expect("put");
    let id = q.take_from(T0, t, SID).expect("tube").expect("free").id;
    black_box(q.ack_in(t, SID, id).expect("owned"));
}

fn bench_utube_take(c: &mut Criterion) {
    let mut g = c.benchmark_group("utube_cycle");
    for &n in &BUSY_UTUBES {
        let (mut q, t) = busy_utubes(n);
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter(|| utube_cycle(&mut q, t))
        });
    }
    g.finish();
}

/// Per-operation percentiles of a utube take+ack (one clock read around each pair).
fn utube_percentiles() -> Value {
    let mut out = serde_json::Map::new();
    for &n in &BUSY_UTUBES {
        let (mut q, t) = busy_utubes(n);
        let p = TubePut {
            utube: b"free",
            ..TubePut::default()
        };
        let mut ns = Vec::with_capacity(UTUBE_SAMPLES);
        for _ in 0..UTUBE_SAMPLES {
            q.put_in(T0, t, payload(), p).expect("put");
            let start = Instant::now();
            let id = q.take_from(T0, t, SID).expect("tube").expect("free").id;
            black_box(q.ack_in(t, SID, id).expect("owned"));
            ns.push(start.elapsed().as_nanos() as u64);
        }
        ns.sort_unstable();
        let at = |p: f64| ns[((ns.len() as f64 * p) as usize).min(ns.len() - 1)];
        out.insert(
            n.to_string(),
            json!({"p50_ns": at(0.50), "p99_ns": at(0.99), "p999_ns": at(0.999), "max_ns": ns[ns.len() - 1]}),
        );
    }
    Value::Object(out)
}

/// Deterministic spread of priorities (an LCG), the same for both implementations.
fn pri_of(i: usize) -> i64 {
    let x = (i as u64)
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    ((x >> 33) % PRI_SPREAD) as i64
}

/// `n` ready tasks spread over priorities, and WORK tasks of priority `mid` held taken: every
/// release lands in the middle of the ready list, by (pri, id). Returns the held ids.
fn deep_queue_with_held_tasks(n: usize, mid: i64) -> (Queue, Vec<u64>) {
    let mut q = Queue::new();
    for i in 0..n {
        let pri = pri_of(i);
        q.put(
            T0,
            payload(),
            PutOptions {
                pri,
                ..Default::default()
            },
        );
    }
    let work: Vec<u64> = (0..WORK)
        .map(|_| {
            q.put(
                T0,
                payload(),
                PutOptions {
                    pri: mid,
                    ..Default::default()
                },
            )
            .id
        })
        .collect();
    for &id in &work {
        q.restore_status(id, Status::Taken, 0).expect("live");
    }
    (q, work)
}

fn bench_release(c: &mut Criterion) {
    let mut g = c.benchmark_group("release_deep");
    let mid = (PRI_SPREAD / 2) as i64;
    for &n in &SIZES {
        let (mut q, work) = deep_queue_with_held_tasks(n, mid);
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(WORK);
                    let t = Instant::now();
                    for &id in &work[..k] {
                        black_box(q.release(T0, 0, id, 0).expect("held").id);
                    }
                    total += t.elapsed();
                    for &id in &work[..k] {
                        q.restore_status(id, Status::Taken, 0).expect("live");
                    }
                    left -= k;
                }
                total
            })
        });
        drop(q);
        let mut q = Baseline::new();
        for i in 0..n {
            q.put(T0, payload(), pri_of(i), None);
        }
        let work: Vec<u64> = (0..WORK).map(|_| q.put(T0, payload(), mid, None)).collect();
        for &id in &work {
            q.force_taken(id, SID);
        }
        g.bench_with_input(BenchmarkId::new("btreemap", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters as usize;
                while left > 0 {
                    let k = left.min(WORK);
                    let t = Instant::now();
                    for &id in &work[..k] {
                        black_box(q.release(SID, id));
                    }
                    total += t.elapsed();
                    for &id in &work[..k] {
                        q.force_taken(id, SID);
                    }
                    left -= k;
                }
                total
            })
        });
    }
    g.finish();
}

/// One `advance` step of ADVANCE_BUDGET expiries while EXPIRING tasks are due; the untimed
/// part puts as many new (already due) tasks back, so the heap stays at EXPIRING entries.
fn bench_advance(c: &mut Criterion) {
    let mut g = c.benchmark_group("advance_step");
    g.sample_size(20);
    let due = T0 + 1;
    for &n in &SIZES {
        let mut q = engine_with(n);
        for _ in 0..EXPIRING {
            q.put(T0, payload(), ttl_opts(1));
        }
        g.bench_with_input(BenchmarkId::new("tarq", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let adv = q.advance(due, ADVANCE_BUDGET);
                    total += t.elapsed();
                    assert_eq!(adv.processed, ADVANCE_BUDGET);
                    for _ in 0..ADVANCE_BUDGET {
                        q.put(T0, payload(), ttl_opts(1));
                    }
                }
                total
            })
        });
        drop(q);
        let mut q = baseline_with(n);
        for _ in 0..EXPIRING {
            q.put(T0, payload(), 0, Some(1));
        }
        g.bench_with_input(BenchmarkId::new("btreemap", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let done = q.advance(due, ADVANCE_BUDGET);
                    total += t.elapsed();
                    assert_eq!(done, ADVANCE_BUDGET);
                    for _ in 0..ADVANCE_BUDGET {
                        q.put(T0, payload(), 0, Some(1));
                    }
                }
                total
            })
        });
    }
    g.finish();
}

/// CPU time of this thread: on a shared machine a step's wall time includes the time the
/// scheduler gave to others, its CPU time does not. Both are recorded.
fn thread_cpu() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Times every step of draining EXPIRING due tasks with ADVANCE_BUDGET per step, by the wall
/// clock and by this thread's CPU time.
fn drain_steps(budget: usize, mut step: impl FnMut(usize) -> usize) -> Value {
    let mut wall = Vec::with_capacity(EXPIRING / budget + 1);
    let mut cpu = Vec::with_capacity(EXPIRING / budget + 1);
    let mut expired = 0;
    let (start, start_cpu) = (Instant::now(), thread_cpu());
    loop {
        let (t, c) = (Instant::now(), thread_cpu());
        let n = step(budget);
        let (dt, dc) = (t.elapsed(), thread_cpu() - c);
        if n == 0 {
            break;
        }
        expired += n;
        wall.push(dt);
        cpu.push(dc);
    }
    let (total, total_cpu) = (start.elapsed(), thread_cpu() - start_cpu);
    assert_eq!(expired, EXPIRING, "every due task expired");
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let summary = |mut v: Vec<Duration>, total: Duration| {
        v.sort_unstable();
        let p = |q: f64| us(v[((v.len() - 1) as f64 * q) as usize]);
        json!({
            "worst_step_us": us(*v.last().expect("steps")),
            "p99_step_us": p(0.99),
            "median_step_us": p(0.5),
            "total_ms": total.as_secs_f64() * 1e3,
            "ns_per_expiry": total.as_secs_f64() * 1e9 / EXPIRING as f64,
        })
    };
    json!({
        "steps": wall.len(),
        "wall": summary(wall, total),
        "cpu": summary(cpu, total_cpu),
    })
}

/// The worst single `advance` step while draining 1M due tasks, per size, budget and
/// implementation.
fn advance_drain() -> Value {
    let due = T0 + 1;
    let mut out = serde_json::Map::new();
    for &n in &SIZES {
        let mut per_budget = serde_json::Map::new();
        for &budget in &DRAIN_BUDGETS {
            let mut q = engine_with(n);
            for _ in 0..EXPIRING {
                q.put(T0, payload(), ttl_opts(1));
            }
            let tarq = drain_steps(budget, |b| q.advance(due, b).processed);
            drop(q);
            let mut base = baseline_with(n);
            for _ in 0..EXPIRING {
                base.put(T0, payload(), 0, Some(1));
            }
            let btree = drain_steps(budget, |b| base.advance(due, b));
            println!(
                "advance drain of {EXPIRING} due at {n} resident, budget {budget}: \
                 tarq {tarq}, btreemap {btree}"
            );
            per_budget.insert(
                budget.to_string(),
                json!({ "tarq": tarq, "btreemap": btree }),
            );
        }
        out.insert(n.to_string(), Value::Object(per_budget));
    }
    Value::Object(out)
}

fn main() {
    // `cargo test --benches` / `--list` runs the benches once as a smoke test: no record then.
    let smoke = std::env::args().any(|a| a == "--test" || a == "--list");
    let mut c = Criterion::default()
        .output_directory(&report::criterion_dir())
        .configure_from_args();
    bench_put(&mut c);
    bench_take_ack(&mut c);
    bench_cycle(&mut c);
    bench_release(&mut c);
    bench_advance(&mut c);
    bench_put_tube(&mut c);
    bench_utube_take(&mut c);
    c.final_summary();
    if smoke {
        return;
    }

    let mut groups = serde_json::Map::new();
    for group in ["put", "take_ack", "cycle", "release_deep", "advance_step"] {
        let mut g = serde_json::Map::new();
        for &n in &SIZES {
            let mut row = serde_json::Map::new();
            for f in ["tarq", "btreemap"] {
                if let Some(e) = report::estimates(group, f, &n.to_string()) {
                    row.insert(f.into(), e);
                }
            }
            let median = |f: &str| row.get(f).and_then(|e| e["median_ns"]["point"].as_f64());
            if let (Some(t), Some(b)) = (median("tarq"), median("btreemap")) {
                row.insert("btreemap_over_tarq".into(), json!(b / t));
            }
            g.insert(n.to_string(), Value::Object(row));
        }
        groups.insert(group.into(), Value::Object(g));
    }
    for (group, sizes, fns) in [
        ("put_tube", SIZES.to_vec(), &["default", "tube"][..]),
        ("utube_cycle", BUSY_UTUBES.to_vec(), &["tarq"][..]),
    ] {
        let mut g = serde_json::Map::new();
        for n in sizes {
            let mut row = serde_json::Map::new();
            for &f in fns {
                if let Some(e) = report::estimates(group, f, &n.to_string()) {
                    row.insert(f.into(), e);
                }
            }
            g.insert(n.to_string(), Value::Object(row));
        }
        groups.insert(group.into(), Value::Object(g));
    }
    let doc = json!({
        "units": "criterion estimates in ns per operation (advance_step: per step)",
        "advance_budget": ADVANCE_BUDGET,
        "expiring": EXPIRING,
        "payload_bytes": payload().len(),
        "groups": groups,
        "advance_drain": advance_drain(),
        "utube_take_ack_percentiles": utube_percentiles(),
    });
    match report::update("engine", doc) {
        Ok(path) => println!("results written to {}", path.display()),
        Err(e) => eprintln!("could not write results: {e}"),
    }
}
