// Every beanstalk command a client can send, driven through the npm `beanstalkd` client (by
// burstable), unchanged.
//
//     node node_flow.js <host> <port>        (after `npm ci` in this directory)
//
// The same flow as greenstalk_flow.py, with the same normalised transcript (see there for what
// is normalised and why): one line per step, "end of flow" last. A protocol error is printed as
// the reply the client rejected with (`NOT_FOUND`, ...); anything else (a closed connection, a
// call that never answers within CALL_TIMEOUT_MS) fails the script with exit code 1.
// `net/tests/beanstalk_clients.rs` compares the transcripts of real beanstalkd and tarq.
//
// The client has no method for `kick` and `reserve-job` (its protocol module knows `kick` but
// the client does not export it; `reserve-job` is newer than the client): both are added through
// the extension points its README documents (`addCommand`), as its users would.

'use strict';

process.noDeprecation = true; // the client calls `new Buffer()`, which warns on stderr

const Beanstalkd = require('beanstalkd').default;

Beanstalkd.addCommand('kick', 'KICKED');
Beanstalkd.prototype.protocol.addCommand('reserve-job <id>\r\n');
Beanstalkd.addCommand('reserve-job', 'RESERVED');

// Bound on every call, so that a server that never answers fails the script instead of hanging
// it; the longest wait asked of the server is WAKE_TIMEOUT.
const CALL_TIMEOUT_MS = 20000;
// How long a reserve-with-timeout waits for a job that must come: room for a loaded machine.
const WAKE_TIMEOUT = 5;
// How long to wait for the server to show a reserve waiting (polling stats-tube).
const WAIT_DEADLINE_MS = 5000;
// Pause between two polls of the server while waiting for a state (not a wait for an event).
const POLL_INTERVAL_MS = 5;
// A delay no step lets run out: jobs that must stay delayed until kicked.
const LONG_DELAY = 100;
// The client's defaults are those of greenstalk's put, so the two flows put the same jobs.
const PRI = 65536;
const TTR = 60;
// An id no fresh server holds.
const MISSING_ID = 999999;
// Every tube the flow makes.
const TUBES = ['flow', 'short', 'wait', 'gone', 'paused'];
// The keys of stats-job and stats-tube that protocol.txt lists, in its order.
const STATS_JOB_KEYS = ['id', 'tube', 'state', 'pri', 'age', 'delay', 'ttr', 'time-left', 'file',
  'reserves', 'timeouts', 'releases', 'buries', 'kicks'];
const STATS_TUBE_KEYS = ['name', 'current-jobs-urgent', 'current-jobs-ready',
  'current-jobs-reserved', 'current-jobs-delayed', 'current-jobs-buried', 'total-jobs',
  'current-using', 'current-waiting', 'current-watching', 'pause', 'cmd-delete',
  'cmd-pause-tube', 'pause-time-left'];
// The job counters of `stats` compared between servers (the rest is per-process, counts
// connections, tubes or commands, or is tarq's own).
const STATS_COUNTERS = ['current-jobs-urgent', 'current-jobs-ready', 'current-jobs-reserved',
  'current-jobs-delayed', 'current-jobs-buried', 'total-jobs', 'job-timeouts', 'max-job-size'];
// What a beanstalkd version looks like to clients: "1.12", "1.13.1".
const VERSION = /^\d+\.\d+(\.\d+)*([-+][0-9A-Za-z.+-]*)?$/;

// Job ids renamed #1, #2, ... in the order they first appear.
const names = new Map();
function ids(id) {
  if (!names.has(id)) names.set(id, `#${names.size + 1}`);
  return names.get(id);
}

function say(step, result) {
  process.stdout.write(`${step}: ${result}\n`);
}

function within(promise, what) {
  let timer;
  const limit = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`FAIL: ${what} unanswered after ${CALL_TIMEOUT_MS} ms`)),
      CALL_TIMEOUT_MS);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

// A rejection with a reply name (`NOT_FOUND`) is the server's answer; anything else is a failure.
function protocolError(e) {
  return e instanceof Error && /^[A-Z_]+$/.test(e.message) && e.message !== 'CONNECTION_CLOSED';
}

// Runs `call`, prints its result through `show` or the reply the client rejected with, and
// returns the result (null after an error reply).
async function step(name, call, show = String) {
  let result;
  try {
    result = await within(call(), name);
  } catch (e) {
    if (!protocolError(e)) throw e;
    say(name, e.message);
    return null;
  }
  say(name, show(result));
  return result;
}

const ok = () => 'ok';
const job = ([id, body]) => `job ${ids(id)} ${JSON.stringify(body.toString('utf8'))}`;
const list = (xs) => JSON.stringify(xs);

function bounded(value, bound) {
  const int = (x) => Number.isInteger(x) && x >= 0;
  return int(value) && int(bound) && value <= bound ? `<=${bound}` : `${JSON.stringify(value)}?`;
}

function statsJob(s) {
  return STATS_JOB_KEYS.map((key) => {
    if (!(key in s)) return `${key}=<missing>`;
    let v = s[key];
    if (key === 'id') v = ids(v);
    else if (key === 'age') v = bounded(v, 60);
    else if (key === 'time-left' && s.state === 'reserved') v = bounded(v, s.ttr);
    else if (key === 'time-left' && s.state === 'delayed') v = bounded(v, s.delay);
    // tarq keeps only what is left of a delay (see greenstalk_flow.py)
    else if (key === 'delay' && s.state !== 'delayed') v = Number.isInteger(v) && v >= 0 ? 'n' : `${v}?`;
    return `${key}=${v}`;
  }).join(' ');
}

function statsTube(s) {
  return STATS_TUBE_KEYS.map((key) => {
    let v = key in s ? s[key] : '<missing>';
    if (key === 'pause-time-left') v = bounded(v, s.pause);
    return `${key}=${v}`;
  }).join(' ');
}

function stats(s) {
  // js-yaml reads an unquoted `1.12` as a number: a client sees the same version either way.
  const version = s.version === undefined ? undefined : String(s.version);
  const out = [
    'version=' + (version !== undefined && VERSION.test(version) ? 'beanstalkd-like' : `${version}?`),
    'pid=' + (Number.isInteger(s.pid) && s.pid > 0 ? 'present' : `${s.pid}?`),
  ];
  for (const key of STATS_COUNTERS) out.push(`${key}=${key in s ? s[key] : '<missing>'}`);
  return out.join(' ');
}

// list-tubes in name order, compared whole (see greenstalk_flow.py).
function tubes(all) {
  return list([...all].sort());
}

async function waitFor(what, cond) {
  const deadline = Date.now() + WAIT_DEADLINE_MS;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`FAIL: ${what} not seen within ${WAIT_DEADLINE_MS} ms`);
    await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
  }
}

async function connect(host, port) {
  return within(new Beanstalkd(host, port).connect(), 'connect');
}

async function main(host, port) {
  const a = await connect(host, port);

  // --- a fresh connection, a fresh server
  await step('list-tube-used', () => a.listTubeUsed());
  await step('list-tubes-watched', () => a.listTubesWatched(), list);
  await step('stats (fresh)', () => a.stats(), stats);
  await step('stats-tube nosuch', () => a.statsTube('nosuch'), statsTube);

  // --- put and peek: priorities, delays, bodies with CRLF and UTF-8, the empty body
  await step('use flow', () => a.use('flow'), ok);
  await step('list-tube-used', () => a.listTubeUsed());
  const j1 = await step('put hello pri=10 ttr=60', () => a.put(10, 0, 60, 'hello'), ids);
  await step('put world pri=5', () => a.put(5, 0, TTR, 'world'), ids);
  const j3 = await step('put later pri=0 delay=100', () => a.put(0, LONG_DELAY, TTR, 'later'), ids);
  const j4 = await step('put crlf pri=max', () => a.put(2 ** 32 - 1, 0, TTR, 'line1\r\nline2 \u00fc'), ids);
  const j5 = await step('put empty pri=1024 delay=200', () => a.put(1024, 2 * LONG_DELAY, TTR, ''), ids);
  await step('peek-ready', () => a.peekReady(), job);
  await step('peek-delayed', () => a.peekDelayed(), job);
  await step('peek-buried', () => a.peekBuried(), job);
  for (const [name, id] of [['j1', j1], ['j4', j4], ['j5', j5]]) {
    await step(`peek ${name}`, () => a.peek(id), job);
  }
  await step('peek missing', () => a.peek(MISSING_ID), job);
  await step('stats-job j3', () => a.statsJob(j3), statsJob);
  await step('stats-job missing', () => a.statsJob(MISSING_ID), statsJob);
  await step('stats-tube flow', () => a.statsTube('flow'), statsTube);
  await step('stats (jobs put)', () => a.stats(), stats);

  // --- watch and ignore
  await step('watch flow', () => a.watch('flow'));
  await step('ignore default', () => a.ignore('default'));
  await step('ignore flow (the last)', () => a.ignore('flow'));
  await step('list-tubes-watched', () => a.listTubesWatched(), list);

  // --- reserve, touch, release, bury, kick
  let r = await step('reserve-with-timeout 0', () => a.reserveWithTimeout(0), job);
  await step('stats-job (reserved)', () => a.statsJob(r[0]), statsJob);
  await step('touch', () => a.touch(r[0]), ok);
  await step('release pri=20', () => a.release(r[0], 20, 0), ok);
  await step('release again', () => a.release(r[0], 20, 0), ok);
  await step('peek-ready', () => a.peekReady(), job);
  r = await step('reserve', () => a.reserve(), job);
  await step('bury pri=7', () => a.bury(r[0], 7), ok);
  await step('bury again', () => a.bury(r[0], 7), ok);
  await step('peek-buried', () => a.peekBuried(), job);
  await step('stats-job (buried)', () => a.statsJob(r[0]), statsJob);
  await step('stats-tube flow', () => a.statsTube('flow'), statsTube);
  await step('stats (buried)', () => a.stats(), stats);
  await step('kick 10 (the buried first)', () => a.kick(10));
  await step('kick 10 (then the delayed)', () => a.kick(10));
  await step('kick 10 (none left)', () => a.kick(10));
  await step('peek-delayed', () => a.peekDelayed(), job);
  await step('kick-job j1 (ready)', () => a.kickJob(j1), ok);
  const j6 = await step('put kickme delay=100', () => a.put(PRI, LONG_DELAY, TTR, 'kickme'), ids);
  await step('kick-job j6 (delayed)', () => a.kickJob(j6), ok);
  await step('stats-job j6 (kicked)', () => a.statsJob(j6), statsJob);

  // --- reserve-job and delete; the errors of a job that is gone
  await step('reserve-job j3', () => a.reserveJob(j3), job);
  await step('reserve-job j3 (reserved)', () => a.reserveJob(j3), job);
  await step('reserve-job missing', () => a.reserveJob(MISSING_ID), job);
  await step('delete j3', () => a.delete(j3), ok);
  await step('delete j3 again', () => a.delete(j3), ok);
  await step('release j3 (gone)', () => a.release(j3, PRI, 0), ok);
  await step('bury j3 (gone)', () => a.bury(j3, PRI), ok);
  await step('touch j3 (gone)', () => a.touch(j3), ok);
  await step('kick-job j3 (gone)', () => a.kickJob(j3), ok);
  await step('stats-job j3 (gone)', () => a.statsJob(j3), statsJob);
  await step('peek j3 (gone)', () => a.peek(j3), job);

  // --- reserve order by priority, then by age; release with a delay comes back after it
  const first = await step('reserve (pri 7)', () => a.reserve(), job);
  await step('delete', () => a.delete(first[0]), ok);
  const held = await step('reserve (pri 20)', () => a.reserve(), job);
  for (const what of ['pri 1024', 'pri 65536', 'pri max']) {
    r = await step(`reserve-with-timeout 0 (${what})`, () => a.reserveWithTimeout(0), job);
    await step('delete', () => a.delete(r[0]), ok);
  }
  await step('release pri=20 delay=1', () => a.release(held[0], 20, 1), ok);
  await step('stats-job (released delayed)', () => a.statsJob(held[0]), statsJob);
  await step('reserve-with-timeout 0 (nothing ready)', () => a.reserveWithTimeout(0), job);
  let back = await step(`reserve-with-timeout ${WAKE_TIMEOUT} (the delay runs out)`,
    () => a.reserveWithTimeout(WAKE_TIMEOUT), job);
  await step('delete', () => a.delete(back[0]), ok);
  await step('stats-tube flow', () => a.statsTube('flow'), statsTube);

  // --- TTR: 0 becomes 1; DEADLINE_SOON in the last second; the job times out to another
  await step('use short', () => a.use('short'), ok);
  await step('watch short', () => a.watch('short'));
  await step('ignore flow', () => a.ignore('flow'));
  const j7 = await step('put quick ttr=0', () => a.put(PRI, 0, 0, 'quick'), ids);
  await step('stats-job j7 (ttr 1)', () => a.statsJob(j7), statsJob);
  const quick = await step('reserve', () => a.reserve(), job);
  await step('reserve-with-timeout 2 (in the safety margin)', () => a.reserveWithTimeout(2), job);
  await step('touch (in the safety margin)', () => a.touch(quick[0]), ok);
  // Polled on a, the connection holding the job: beanstalkd 1.12 misses the deadlines of a
  // connection that idles (see greenstalk_flow.py).
  await waitFor("the TTR of a's job to run out",
    async () => (await within(a.statsJob(quick[0]), 'stats-job')).state === 'ready');
  await step('stats-job (timed out)', () => a.statsJob(quick[0]), statsJob);
  const b = await connect(host, port);
  await step('b: watch short', () => b.watch('short'));
  await step('b: ignore default', () => b.ignore('default'));
  const late = await step('b: reserve-with-timeout 0 (the timed-out job)',
    () => b.reserveWithTimeout(0), job);
  await step("delete (no longer a's)", () => a.delete(quick[0]), ok);
  await step("touch (no longer a's)", () => a.touch(quick[0]), ok);
  await step('stats-job (reserved by b)', () => b.statsJob(late[0]), statsJob);
  await step('b: delete', () => b.delete(late[0]), ok);
  await step('stats (a timeout)', () => a.stats(), stats);

  // --- a reserve waiting on a gets the job b puts
  await step('watch wait', () => a.watch('wait'));
  await step('ignore short', () => a.ignore('short'));
  // Printed once b's put has been, whichever reply the loop reads first.
  const waiting = within(a.reserveWithTimeout(WAKE_TIMEOUT), "a's waiting reserve").then(
    (j) => ({ j }),
    (e) => { if (protocolError(e)) return { e: e.message }; throw e; },
  );
  await waitFor("a's reserve waiting on tube wait",
    async () => (await within(b.statsTube('wait'), 'stats-tube wait'))['current-waiting'] === 1);
  await step('b: use wait', () => b.use('wait'), ok);
  await step('b: put from-b', () => b.put(PRI, 0, TTR, 'from b'), ids);
  const fromB = await waiting;
  say(`reserve-with-timeout ${WAKE_TIMEOUT} (waiting for b's put)`, fromB.e || job(fromB.j));
  await step('delete', () => a.delete(fromB.j[0]), ok);

  // --- c's reservation goes back when c disconnects, to b waiting for it
  const c = await connect(host, port);
  await step('c: use gone', () => c.use('gone'), ok);
  await step('c: put held', () => c.put(PRI, 0, TTR, 'held'), ids);
  await step('c: watch gone', () => c.watch('gone'));
  await step('c: ignore default', () => c.ignore('default'));
  const cHeld = await step('c: reserve', () => c.reserve(), job);
  await step('b: watch gone', () => b.watch('gone'));
  await step('b: ignore short', () => b.ignore('short'));
  await step('b: list-tubes-watched', () => b.listTubesWatched(), list);
  await step('stats-tube gone', () => a.statsTube('gone'), statsTube);
  await step("b: delete (c's)", () => b.delete(cHeld[0]), ok);
  await c.quit();
  back = await step(`b: reserve-with-timeout ${WAKE_TIMEOUT} (c disconnected)`,
    () => b.reserveWithTimeout(WAKE_TIMEOUT), job);
  await step('stats-job (reserved again)', () => b.statsJob(back[0]), statsJob);
  await step('b: delete', () => b.delete(back[0]), ok);

  // --- pause-tube holds reserves back for its time
  await step('pause-tube nosuch', () => a.pauseTube('nosuch', 1), ok);
  await step('use paused', () => a.use('paused'), ok);
  await step('watch paused', () => a.watch('paused'));
  await step('ignore wait', () => a.ignore('wait'));
  await step('put after-pause', () => a.put(PRI, 0, TTR, 'after pause'), ids);
  await step('pause-tube paused 1', () => a.pauseTube('paused', 1), ok);
  await step('stats-tube paused', () => a.statsTube('paused'), statsTube);
  await step('reserve-with-timeout 0 (paused)', () => a.reserveWithTimeout(0), job);
  const after = await step(`reserve-with-timeout ${WAKE_TIMEOUT} (the pause runs out)`,
    () => a.reserveWithTimeout(WAKE_TIMEOUT), job);
  await step('delete', () => a.delete(after[0]), ok);

  // --- the max job size; the connection goes on after JOB_TOO_BIG
  const limit = (await within(a.stats(), 'stats'))['max-job-size'];
  await step('put max-job-size + 1 bytes', () => a.put(PRI, 0, TTR, 'x'.repeat(limit + 1)), ids);
  await step('list-tube-used (after JOB_TOO_BIG)', () => a.listTubeUsed());
  await step('put max-job-size bytes', () => a.put(PRI, 0, TTR, 'y'.repeat(limit)), ids);
  r = await step('reserve (the biggest job)', () => a.reserve(),
    ([id, body]) => `job ${ids(id)} ${body.length} bytes ${JSON.stringify([...new Set(body.toString())])}`);
  await step('delete', () => a.delete(r[0]), ok);

  // --- every tube this flow made, watched at once, so that none is gone on beanstalkd
  for (const t of TUBES) await step(`watch ${t}`, () => a.watch(t));
  await step('list-tubes-watched', () => a.listTubesWatched(), (ts) => list([...ts].sort()));
  await step('list-tubes', () => a.listTubes(), tubes);
  await step('stats (end)', () => a.stats(), stats);
  await b.quit();
  await a.quit();
  process.stdout.write('end of flow\n');
}

if (process.argv.length !== 4) {
  process.stderr.write('usage: node node_flow.js <host> <port>\n');
  process.exit(2);
}
main(process.argv[2], Number(process.argv[3])).then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
    process.exit(1);
  },
);
