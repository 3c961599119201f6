//! Criterion benches of a move's engine side (`tarq ctl move`), per task: `export` pages
//! through a tube of 1M tasks of 64-byte payloads in mixed statuses (a quarter each Ready,
//! Waiting, Taken by 64 sessions with a TTR, Buried) `PAGE` tasks at a time; `import` puts
//! those tasks into a fresh queue's tube at the same index, journal on, filling it from empty
//! to 1M and starting again; `export_sparse` pages through a tube whose ids are sparse (one
//! live task in `SPARSE_GAP`, 100k live), where pages find their rest by walking the arena
//! (`tarq_engine::EXPORT_PROBES_PER_TASK`). Criterion's figure is ns per task. Everything lands
//! in the "moving" section of `results/engine/<date>-<commit>.json` (see `results/README.md`).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use serde_json::{json, Value};
use tarq_benches::report;
use tarq_engine::{MovedTask, Queue, TaskId, TubeIx, TubeOptions, TubePut, TubeType};

/// Tasks in the moved tube.
const N: usize = 1_000_000;
/// Payload bytes of each task.
const PAYLOAD: usize = 64;
/// Tasks per export page: what a mover would send in one message (64 KiB of payloads).
const PAGE: usize = 1000;
/// Tasks imported per timed batch, between the untimed copies of the next batch.
const CHUNK: usize = 10_000;
/// Sessions holding the Taken quarter.
const SESSIONS: u64 = 64;
/// Live tasks and the spacing of their ids in the sparse export.
const SPARSE_LIVE: usize = 100_000;
const SPARSE_GAP: usize = 16;
/// The tube's index on both nodes.
const TUBE: TubeIx = 1;
const T0: u64 = 1_700_000_000_000_000;
const SEC: u64 = 1_000_000;

fn opts() -> TubeOptions {
    TubeOptions {
        ttl: Some(3600 * SEC),
        ttr: Some(60 * SEC),
        ..TubeOptions::default()
    }
}

fn node() -> Queue {
    let mut q = Queue::new();
    q.create_tube_at(TUBE, "moved", TubeType::FifoTtl, opts(), 0)
        .expect("new tube");
    q
}

fn put(q: &mut Queue, delay: u64) -> TaskId {
    let data = vec![0xa5; PAYLOAD];
    let p = TubePut {
        delay,
        ..TubePut::default()
    };
    match q.put_in(T0, TUBE, data, p) {
        Ok(tarq_engine::PutOutcome::Created(t)) => t.id,
        _ => panic!("put refused"),
    }
}

/// The old owner: N tasks, by id in turn Ready, Waiting, Taken, Buried.
fn source() -> Queue {
    let mut q = node();
    for i in 0..N as u64 {
        let id = put(&mut q, if i % 4 == 1 { 10 * SEC } else { 0 });
        match i % 4 {
            2 => {
                q.take_task(T0, 1 + i % SESSIONS, id).expect("ready");
            }
            3 => {
                q.bury(TUBE, id).expect("live");
            }
            _ => {}
        }
    }
    q
}

/// A tube with one live task in SPARSE_GAP ids.
fn sparse_source() -> Queue {
    let mut q = node();
    for i in 0..SPARSE_LIVE * SPARSE_GAP {
        let id = put(&mut q, 0);
        if i % SPARSE_GAP != 0 {
            q.delete(TUBE, id).expect("live");
        }
    }
    q
}

/// Exports `iters` tasks of `q` page by page, from the start again at the end; the time.
fn export(q: &Queue, iters: u64, after: &mut Option<TaskId>) -> Duration {
    let mut left = iters as usize;
    let t = Instant::now();
    while left > 0 {
        let page = q
            .export_tube(TUBE, *after, PAGE.min(left), usize::MAX)
            .expect("live tube");
        match page.last() {
            Some(last) => *after = Some(last.id),
            None => {
                *after = None;
                continue;
            }
        }
        left -= page.len();
        std::hint::black_box(page);
    }
    t.elapsed()
}

fn bench_export(c: &mut Criterion, src: &Queue, sparse: &Queue) {
    let mut g = c.benchmark_group("move");
    let mut after = None;
    g.bench_function(BenchmarkId::new("export", N), |b| {
        b.iter_custom(|iters| export(src, iters, &mut after))
    });
    let mut after = None;
    g.bench_function(BenchmarkId::new("export_sparse", SPARSE_LIVE), |b| {
        b.iter_custom(|iters| export(sparse, iters, &mut after))
    });
    g.finish();
}

/// Imports `iters` tasks of `pool` into `dst`, a fresh queue each time the pool is spent; only
/// the imports are timed (not the copies of the tasks, which a mover receives owned, nor the
/// drops of full queues).
fn import(dst: &mut Queue, pool: &[MovedTask], next: &mut usize, iters: u64) -> Duration {
    let mut left = iters as usize;
    let mut spent = Duration::ZERO;
    while left > 0 {
        if *next == pool.len() {
            *dst = node();
            dst.set_journal(true);
            *next = 0;
        }
        let n = left.min(CHUNK).min(pool.len() - *next);
        let batch: Vec<MovedTask> = pool[*next..*next + n].to_vec();
        let t = Instant::now();
        for task in batch {
            let owner = task.owner.unwrap_or(0);
            dst.import_task(TUBE, task, owner).expect("new id");
        }
        spent += t.elapsed();
        dst.drain_events().for_each(drop);
        *next += n;
        left -= n;
    }
    spent
}

fn bench_import(c: &mut Criterion, pool: &[MovedTask]) {
    let mut g = c.benchmark_group("move");
    let mut dst = node();
    dst.set_journal(true);
    let mut next = 0;
    g.bench_function(BenchmarkId::new("import", N), |b| {
        b.iter_custom(|iters| import(&mut dst, pool, &mut next, iters))
    });
    g.finish();
}

fn main() {
    // `cargo test --benches` / `--list` runs the benches once as a smoke test: no record then.
    let smoke = std::env::args().any(|a| a == "--test" || a == "--list");
    let mut c = Criterion::default()
        .output_directory(&report::criterion_dir())
        .configure_from_args();
    let src = source();
    let sparse = sparse_source();
    bench_export(&mut c, &src, &sparse);
    let mut pool = Vec::with_capacity(N);
    let mut after = None;
    loop {
        let page = src
            .export_tube(TUBE, after, PAGE, usize::MAX)
            .expect("live tube");
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        pool.extend(page);
    }
    assert_eq!(pool.len(), N);
    drop(src);
    drop(sparse);
    bench_import(&mut c, &pool);
    c.final_summary();
    if smoke {
        return;
    }
    let mut row = serde_json::Map::new();
    for (f, n) in [("export", N), ("import", N), ("export_sparse", SPARSE_LIVE)] {
        if let Some(e) = report::estimates("move", f, &n.to_string()) {
            row.insert(format!("{f}/{n}"), e);
        }
    }
    let doc = json!({
        "units": "criterion estimates in ns per task",
        "tasks": N,
        "payload_bytes": PAYLOAD,
        "page": PAGE,
        "statuses": "a quarter each Ready, Waiting, Taken (64 sessions, TTR armed), Buried",
        "sparse": { "live": SPARSE_LIVE, "one_id_in": SPARSE_GAP },
        "tasks_per_op": Value::Object(row),
    });
    match report::update("moving", doc) {
        Ok(path) => println!("results written to {}", path.display()),
        Err(e) => eprintln!("could not write results: {e}"),
    }
}
