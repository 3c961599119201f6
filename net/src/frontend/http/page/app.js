// The tarq console: one page, no build step. It reads the JSON API of the tarq that served it
// (nothing else: no request leaves that machine), loads the last 15 minutes of per-second
// figures so every chart is full at once, then follows /api/events (one event a second) while
// the page is visible, and stops listening while it is hidden. Elements tests read carry
// data- attributes: rows data-tube="NAME", cells data-status="ready" and so on.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const SERIES = ["put", "take", "ack", "ready", "taken", "delayed", "buried"];
const STATUSES = ["ready", "delayed", "buried", "taken"];
const state = {
  view: "overview",
  tube: null,
  found: null,
  readOnly: true,
  readOnlyWhy: "",
  // Who the console acts as (`/api/server`'s `you`) and its rights on the tube shown: a user
  // is offered only the actions it may take (the server checks each one again).
  you: { user: null, admin: false, every_tube: [] },
  rights: [],
  charts: {},
  history: null,
  tubeHistory: null,
  source: null,
  taskStatus: "ready",
  taskAfter: null,
  tableDue: 0,
  filter: "",
};

function css(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function say(text, kind = "info") {
  const m = $("#message");
  m.textContent = text;
  m.dataset.kind = kind;
}

async function api(path, opts = {}) {
  const init = { headers: {}, ...opts };
  if (opts.body !== undefined) {
    init.method = init.method || "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(opts.body);
  }
  const r = await fetch(path, init);
  const text = await r.text();
  let v = null;
  try { v = text ? JSON.parse(text) : null; } catch (_) { v = { error: text }; }
  if (!r.ok) throw new Error((v && v.error) || `${r.status} ${r.statusText}`);
  return v;
}

async function act(label, path, body = {}) {
  try {
    const v = await api(path, { body });
    say(`${label}: done`);
    refreshSoon();
    return v;
  } catch (e) {
    say(`${label}: ${e.message}`, "error");
    return null;
  }
}

// ---- charts ----

function chartOpts(el, series) {
  return {
    width: Math.max(300, el.clientWidth - 4),
    height: 220,
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    scales: { x: { time: true } },
    axes: [
      // Whole seconds at least: the figures are a second apart.
      { stroke: css("--muted"), grid: { stroke: css("--line") }, ticks: { stroke: css("--line") },
        incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900] },
      { stroke: css("--muted"), grid: { stroke: css("--line") }, ticks: { stroke: css("--line") }, size: 60 },
    ],
    series: [{}].concat(series.map((s) => ({ label: s, stroke: css("--" + s), width: 1.5, points: { show: false } }))),
  };
}

// History JSON → uPlot data: [times, ...series].
function toData(h, key, names) {
  const rows = h[key];
  if (!rows) return null;
  const n = rows[0].length;
  const t = Array.from({ length: n }, (_, i) => h.end - (n - 1 - i));
  return [t].concat(names.map((name) => rows[SERIES.indexOf(name)].slice()));
}

function draw(id, data, names) {
  const el = document.getElementById(id);
  if (!el || !data) return;
  let c = state.charts[id];
  if (!c || c.root.parentNode !== el) {
    el.textContent = "";
    c = new uPlot(chartOpts(el, names), data, el);
    state.charts[id] = c;
  } else {
    c.setData(data);
  }
  // Drawn while its view was hidden, or the window changed: fit the width it has now.
  const width = Math.max(300, el.clientWidth - 4);
  if (el.clientWidth > 0 && Math.abs(c.width - width) > 8) c.setSize({ width, height: 220 });
  el.dataset.points = String(data[0].length);
  el.dataset.nonzero = String(data.slice(1).some((s) => s.some((v) => v > 0)));
}

// Appends one second to uPlot data, keeping 15 minutes.
function append(data, t, values) {
  if (!data) return;
  if (data[0].length && data[0][data[0].length - 1] >= t) return;
  data[0].push(t);
  values.forEach((v, i) => data[i + 1].push(v));
  if (data[0].length > 900) data.forEach((a) => a.shift());
}

const RATES = ["put", "take", "ack"];
const COUNTS = ["ready", "taken", "delayed", "buried"];

function pick(values, names) {
  return names.map((n) => values[SERIES.indexOf(n)]);
}

// ---- live ----

function listen() {
  if (state.source || document.hidden) return;
  const src = new EventSource("/api/events");
  state.source = src;
  src.onopen = () => { $("#live").textContent = "live"; $("#live").dataset.live = "on"; };
  src.onerror = () => { $("#live").textContent = "reconnecting"; $("#live").dataset.live = "off"; };
  src.onmessage = (ev) => onEvent(JSON.parse(ev.data));
}

function stopListening() {
  if (state.source) state.source.close();
  state.source = null;
  $("#live").textContent = "paused";
  $("#live").dataset.live = "off";
}

function onEvent(e) {
  if (state.history) {
    append(state.history.rates, e.t, pick(e.overall, RATES));
    append(state.history.counts, e.t, pick(e.overall, COUNTS));
    if (state.view === "overview") {
      draw("chart-rates", state.history.rates, RATES);
      draw("chart-counts", state.history.counts, COUNTS);
    }
  }
  if (state.view === "tube" && state.tubeHistory && e.tubes[state.tube]) {
    append(state.tubeHistory.rates, e.t, pick(e.tubes[state.tube], RATES));
    append(state.tubeHistory.counts, e.t, pick(e.tubes[state.tube], COUNTS));
    draw("chart-tube-rates", state.tubeHistory.rates, RATES);
    draw("chart-tube-counts", state.tubeHistory.counts, COUNTS);
  }
  if (Date.now() >= state.tableDue) refresh();
}

document.addEventListener("visibilitychange", () => {
  if (document.hidden) {
    stopListening();
  } else {
    loadHistory().then(listen);
  }
});

// Whose figures the charts and rates are: this node's, or on a sharded cluster's node the
// whole cluster's (every partition's owner asked once a second), which the captions say.
function showScope(scope) {
  const cluster = scope === "cluster";
  for (const e of document.querySelectorAll("[data-scope]")) {
    e.hidden = !cluster;
    e.dataset.scope = scope;
  }
  for (const th of document.querySelectorAll("[data-rate-head]")) {
    th.title = cluster ? "the whole cluster's, last second (– while an owner did not answer)" : "this node's, last second";
  }
}

async function loadHistory() {
  const h = await api("/api/history");
  showScope(h.scope);
  state.history = { rates: toData(h, "overall", RATES), counts: toData(h, "overall", COUNTS) };
  if (state.view === "overview") {
    draw("chart-rates", state.history.rates, RATES);
    draw("chart-counts", state.history.counts, COUNTS);
  }
  if (state.view === "tube") await loadTubeHistory();
}

async function loadTubeHistory() {
  const h = await api(`/api/tubes/${encodeURIComponent(state.tube)}/history`);
  const key = h.tube ? "tube" : null;
  state.tubeHistory = key
    ? { rates: toData(h, key, RATES), counts: toData(h, key, COUNTS) }
    : { rates: [[], [], [], []], counts: [[], [], [], [], []] };
  draw("chart-tube-rates", state.tubeHistory.rates, RATES);
  draw("chart-tube-counts", state.tubeHistory.counts, COUNTS);
}

// ---- the tube table ----

async function allTubes() {
  let tubes = [];
  let offset = 0;
  for (;;) {
    const page = await api(`/api/tubes?limit=1000&offset=${offset}`);
    tubes = tubes.concat(page.tubes);
    if (page.next === null || page.next === undefined) return tubes;
    offset = page.next;
  }
}

function button(label, title, onClick, danger = false) {
  const b = document.createElement("button");
  b.textContent = label;
  b.title = state.readOnly ? state.readOnlyWhy : title;
  b.disabled = state.readOnly;
  b.dataset.action = label.toLowerCase();
  if (danger) b.className = "danger";
  b.addEventListener("click", onClick);
  return b;
}

/** Whether the user may use `right` (put, take, admin) on tube `t`. */
function may(t, right) {
  return (t.rights || []).includes(right);
}

function tubeActions(t) {
  const name = t.name;
  const path = `/api/tubes/${encodeURIComponent(name)}`;
  const span = document.createElement("span");
  span.className = "actions";
  if (!may(t, "admin")) return span;
  span.append(
    button("Kick", "make buried tasks ready", () => {
      const n = prompt(`Kick how many buried tasks of ${name}?`, String(t.tasks.buried || 1));
      if (n !== null) act(`kick ${name}`, `${path}/kick`, { count: Number(n) });
    }),
    t.paused !== null
      ? button("Resume", "let takes have tasks again", () => act(`resume ${name}`, `${path}/resume`))
      : button("Pause", "hold every take of this tube", () => {
        const s = prompt(`Pause takes of ${name} for how many seconds?`, "60");
        if (s !== null) act(`pause ${name}`, `${path}/pause`, { seconds: Number(s) });
      }),
    button("Truncate", "delete every task", () => {
      if (confirm(`Delete every task of ${name}?`)) act(`truncate ${name}`, `${path}/truncate`);
    }, true),
    button("Drop", "drop the tube", () => {
      if (confirm(`Drop the tube ${name} and its tasks?`)) act(`drop ${name}`, `${path}/drop`);
    }, true),
  );
  return span;
}

const CELLS = [
  ["ready", (t) => t.tasks.ready], ["taken", (t) => t.tasks.taken], ["delayed", (t) => t.tasks.delayed],
  ["buried", (t) => t.tasks.buried], ["done", (t) => t.tasks.done], ["total", (t) => t.tasks.total],
  ["put-rate", (t) => rate(t.rates.put)], ["take-rate", (t) => rate(t.rates.take)], ["ack-rate", (t) => rate(t.rates.ack)],
  ["takers-waiting", (t) => t.consumers.waiting], ["takers-holding", (t) => t.consumers.holding],
  ["oldest-age", (t) => age(t.oldest_ready_age)],
];

/** A rate, or a dash for a second not known (an owner of the tube did not answer). */
function rate(v) {
  return v === null || v === undefined ? "–" : v;
}

/** Seconds as an operator reads an age: 0, 850ms, 12s, 5m, 3h, 2d. */
function age(s) {
  if (!s) return "0";
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  for (const [unit, n] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= n) return `${Math.floor(s / n)}${unit}`;
  }
  return `${Math.floor(s)}s`;
}

function tubeRow(t) {
  const tr = document.createElement("tr");
  tr.dataset.tube = t.name;
  const name = document.createElement("td");
  const a = document.createElement("a");
  a.href = `#/tube/${encodeURIComponent(t.name)}`;
  a.textContent = t.name;
  name.append(a);
  const type = document.createElement("td");
  type.textContent = t.type;
  tr.append(name, type);
  for (const [key] of CELLS) {
    const td = document.createElement("td");
    td.className = "n";
    td.dataset.status = key;
    tr.append(td);
  }
  const actions = document.createElement("td");
  actions.dataset.cell = "actions";
  tr.append(actions);
  return tr;
}

function updateRow(tr, t) {
  CELLS.forEach(([key, get], i) => {
    const td = tr.children[2 + i];
    const v = String(get(t));
    if (td.textContent !== v) td.textContent = v;
    if (v === "0") td.dataset.zero = ""; else delete td.dataset.zero;
  });
  // Ready tasks and no taker: what an operator looks for first.
  const idle = String(t.idle);
  if (tr.dataset.idle !== idle) {
    tr.dataset.idle = idle;
    tr.children[0].title = t.idle ? "idle: tasks are ready and no consumer takes them" : "";
  }
  const paused = t.paused !== null ? "1" : "0";
  const rights = `${state.readOnly} ${t.rights}`;
  if (tr.dataset.paused !== paused || tr.dataset.rights !== rights) {
    tr.dataset.paused = paused;
    tr.dataset.rights = rights;
    tr.lastChild.replaceChildren(tubeActions(t));
  }
}

async function renderTubes() {
  const started = performance.now();
  const tubes = await allTubes();
  const fetched = performance.now();
  const body = $("#tubes tbody");
  const rows = new Map([...body.children].map((tr) => [tr.dataset.tube, tr]));
  const frag = document.createDocumentFragment();
  const filter = state.filter.toLowerCase();
  let shown = 0;
  for (const t of tubes) {
    let tr = rows.get(t.name);
    rows.delete(t.name);
    if (!tr) tr = tubeRow(t);
    updateRow(tr, t);
    tr.hidden = filter !== "" && !t.name.toLowerCase().includes(filter);
    shown += !tr.hidden;
    frag.append(tr);
  }
  body.replaceChildren(frag);
  $("#tube-count").textContent = `${shown} of ${tubes.length}`;
  document.body.dataset.tubesRendered = String(tubes.length);
  // What a test reads: the time to fetch every page of tubes, and to build the table from them.
  document.body.dataset.tubesFetchMs = String(Math.round(fetched - started));
  document.body.dataset.tubesRenderMs = String(Math.round(performance.now() - fetched));
}

// ---- one tube ----

function figure(label, value, key) {
  const d = document.createElement("div");
  d.dataset.figure = key;
  const b = document.createElement("b");
  b.textContent = value;
  const s = document.createElement("span");
  s.textContent = label;
  d.append(b, s);
  return d;
}

async function renderTube() {
  const name = state.tube;
  let t;
  try {
    t = await api(`/api/tubes/${encodeURIComponent(name)}`);
  } catch (e) {
    say(`${name}: ${e.message}`, "error");
    return;
  }
  $("#tube-title").textContent = `${t.name} (${t.type})`;
  const paused = $("#tube-paused");
  paused.hidden = t.paused === null;
  paused.textContent = t.paused === null ? "" : `paused, ${Math.ceil(t.paused)} s left`;
  $("#tube-actions").replaceChildren(tubeActions(t));
  const figs = [
    ...Object.entries(t.tasks).map(([k, v]) => figure(k, v, k)),
    figure("put/s", rate(t.rates.put), "put-rate"),
    figure("take/s", rate(t.rates.take), "take-rate"),
    figure("ack/s", rate(t.rates.ack), "ack-rate"),
  ];
  $("#tube-figures").replaceChildren(...figs);
  // A sharded cluster's tube: the row above is the whole tube; here each partition, where
  // it is and its counts as its owner gave them.
  $("#tasks").toggleAttribute("data-sharded", Array.isArray(t.partitions));
  $("#tube-partitions").replaceChildren(...(Array.isArray(t.partitions) ? [
    heading(`Partitions (${t.partitions.length})`),
    table(t.partitions, [
      ["partition", "partition"], ["index", "index"], ["replica set", "set"], ["primary", "primary"],
      ["ready", (p) => p.tasks?.ready], ["taken", (p) => p.tasks?.taken], ["delayed", (p) => p.tasks?.delayed],
      ["buried", (p) => p.tasks?.buried], ["total", (p) => p.tasks?.total],
      ["put", (p) => p.calls?.put], ["take", (p) => p.calls?.take],
    ], "partition"),
  ] : []));
  const tabs = STATUSES.map((s) => {
    const b = document.createElement("button");
    b.textContent = `${s} (${t.tasks[s]})`;
    b.role = "tab";
    b.dataset.tab = s;
    b.setAttribute("aria-selected", String(s === state.taskStatus));
    b.addEventListener("click", () => { state.taskStatus = s; state.taskAfter = null; state.found = null; renderTube(); });
    return b;
  });
  $("#task-tabs").replaceChildren(...tabs);
  $("#put button").disabled = state.readOnly;
  $("#put button").title = state.readOnly ? state.readOnlyWhy : "put a task";
  $("#put").hidden = !may(t, "put");
  // A producer with `put` alone sees the figures, not the tasks (their data is others').
  state.rights = t.rights || [];
  const seesTasks = may(t, "take") || may(t, "admin");
  for (const id of ["#task-tabs", "#find", "#tasks-wrap"]) $(id).hidden = !seesTasks;
  $("#tasks-denied").hidden = seesTasks;
  if (seesTasks) await renderTasks(false);
  else $("#more").hidden = true;
}

function dataText(task) {
  if (task.data_base64 !== undefined) return `base64:${task.data_base64}`;
  return typeof task.data === "string" ? task.data : JSON.stringify(task.data);
}

function taskRow(task, path) {
  const tr = document.createElement("tr");
  tr.dataset.task = String(task.id);
  // A sharded cluster's listing says which partition each task is in (found by id: unknown).
  if (task.partition !== undefined) tr.dataset.partition = String(task.partition);
  const cells = [task.id, task.partition ?? "", task.status, task.pri, new Date(task.created * 1000).toLocaleString(), task.deliveries, dataText(task)];
  cells.forEach((v, i) => {
    const td = document.createElement("td");
    td.textContent = String(v);
    if (i === 0 || i === 1 || i === 3 || i === 5) td.className = "n";
    if (i === 1) td.dataset.col = "partition";
    if (i === 6) { td.className = "data"; td.title = String(v); }
    tr.append(td);
  });
  const actions = document.createElement("td");
  const span = document.createElement("span");
  span.className = "actions";
  actions.append(span);
  tr.append(actions);
  if (!state.rights.includes("admin")) return tr;
  if (task.status !== "buried" && task.status !== "taken") {
    span.append(button("Bury", "set this task aside", () => act(`bury ${task.id}`, `${path}/${task.id}/bury`)));
  }
  if (task.status === "buried" || task.status === "delayed") {
    span.append(button("Kick", "make this task ready", () => act(`kick ${task.id}`, `${path}/${task.id}/kick`)));
  }
  span.append(button("Delete", "delete this task", () => {
    if (confirm(`Delete task ${task.id}?`)) act(`delete ${task.id}`, `${path}/${task.id}/delete`);
  }, true));
  return tr;
}

async function renderTasks(more) {
  const name = state.tube;
  if (state.found) {
    const path = `/api/tubes/${encodeURIComponent(name)}/tasks`;
    const id = state.found;
    try {
      const r = await api(`${path}/${encodeURIComponent(id)}`);
      $("#tasks tbody").replaceChildren(taskRow(r.task, path));
    } catch (e) {
      $("#tasks tbody").replaceChildren();
      say(`task ${id}: ${e.message}`, "error");
    }
    $("#more").hidden = true;
    return;
  }
  const after = more && state.taskAfter !== null ? `&after=${state.taskAfter}` : "";
  const page = await api(`/api/tubes/${encodeURIComponent(name)}/tasks?status=${state.taskStatus}&limit=50${after}`);
  const path = `/api/tubes/${encodeURIComponent(name)}/tasks`;
  const rows = page.tasks.map((task) => taskRow(task, path));
  const body = $("#tasks tbody");
  if (more) body.append(...rows); else body.replaceChildren(...rows);
  state.taskAfter = page.next_after;
  $("#more").hidden = page.next_after === null;
  // Partitions whose owners did not answer in time: their tasks are not in the list.
  const missing = page.unanswered || [];
  const note = $("#tasks-unanswered");
  note.hidden = missing.length === 0;
  note.dataset.partitions = missing.map((m) => m.partition).join(",");
  note.textContent = missing.length === 0 ? "" : "Not listed: " + missing
    .map((m) => `partition ${m.partition} (replica set ${m.set}): ${m.error}`).join("; ");
}

// ---- cluster ----

function kv(obj) {
  const table = document.createElement("table");
  for (const [k, v] of Object.entries(obj || {})) {
    if (v === undefined) continue;
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.textContent = k;
    const td = document.createElement("td");
    td.textContent = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
    tr.append(th, td);
    table.append(tr);
  }
  const wrap = document.createElement("div");
  wrap.className = "table-wrap";
  wrap.append(table);
  return wrap;
}

function table(rows, columns, key) {
  const t = document.createElement("table");
  const head = document.createElement("tr");
  for (const [label] of columns) {
    const th = document.createElement("th");
    th.textContent = label;
    head.append(th);
  }
  const thead = document.createElement("thead");
  thead.append(head);
  const body = document.createElement("tbody");
  for (const r of rows) {
    const tr = document.createElement("tr");
    tr.dataset[key] = String(r[columns[0][1]] ?? "");
    for (const [, field] of columns) {
      const td = document.createElement("td");
      const v = typeof field === "function" ? field(r) : r[field];
      td.textContent = v === undefined || v === null ? "" : String(v);
      tr.append(td);
    }
    body.append(tr);
  }
  t.append(thead, body);
  const wrap = document.createElement("div");
  wrap.className = "table-wrap";
  wrap.append(t);
  return wrap;
}

function heading(text) {
  const h = document.createElement("h3");
  h.textContent = text;
  return h;
}

async function renderCluster() {
  const [c, s] = await Promise.all([api("/api/cluster"), api("/api/server")]);
  const parts = [];
  const leader = c.leader ? `${c.leader.name} (${c.leader.addr})` : c.primary || (c.role === "leader" ? "this node" : "none known");
  parts.push(kv({ role: c.role, primary: leader, term: c.term ?? c.position_term, position: c.position, state: c.state, cluster: c.cluster, node: c.node }));
  // A sharded cluster lists every set's members below.
  if (Array.isArray(c.members) && !Array.isArray(c.sets)) {
    const top = Math.max(0, ...c.members.map((m) => m.lsn || 0));
    parts.push(heading("Members"), table(c.members, [
      ["member", "name"], ["address", "addr"], ["role", "role"], ["eligible", "eligible"],
      ["term", "term"], ["lsn", "lsn"], ["lag (records)", (m) => top - (m.lsn || 0)],
    ], "member"));
  }
  parts.push(heading("Replicas streaming from this node"), table(c.replicas || [], [
    ["replica", "peer"], ["acknowledged", "acked"], ["lag (records)", "lag_records"], ["lag (bytes)", "lag_bytes"],
  ], "replica"));
  if (c.upstream) {
    parts.push(heading("This node's primary"), kv(c.upstream));
  }
  if (Array.isArray(c.sets)) {
    // A sharded cluster: every replica set, its members with their lag behind its primary,
    // the placement and the moves this node runs.
    parts.push(heading(`Replica sets (this node's: ${c.replica_set})`), table(c.sets, [
      ["set", "name"], ["primary", (x) => x.primary ? `${x.primary.name} (${x.primary.addr})` : "none: electing"],
      ["term", (x) => x.primary?.term], ["members", (x) => (x.members || []).length],
    ], "set"));
    const members = c.sets.flatMap((x) => {
      const top = Math.max(0, ...(x.members || []).map((m) => m.lsn || 0));
      return (x.members || []).map((m) => ({ ...m, set: x.name, lag: top - (m.lsn || 0) }));
    });
    parts.push(heading("Members"), table(members, [
      ["member", "name"], ["set", "set"], ["address", "addr"], ["role", "role"],
      ["health", (m) => (m.eligible ? "eligible" : "not eligible")], ["lsn", "lsn"], ["lag (records)", "lag"],
    ], "member"));
    const placed = (c.placement?.tubes || []).flatMap((t) => (t.partitions || []).map((p) => ({ ...p, tube: t.name })));
    parts.push(heading(`Placement (epoch ${c.placement?.epoch})`), table(placed, [
      ["tube", "tube"], ["partition", "partition"], ["index", "index"], ["replica set", "set"],
    ], "placed"));
    // This node's links to the other sets, and every set's primary's moves (asked over
    // the links, a second or two old): one look shows each move in flight anywhere.
    parts.push(heading("Links from this node"), table(c.links || [], [
      ["replica set", "set"], ["primary", "primary"], ["state", "state"],
      ["for", (l) => (l.for_ms === null || l.for_ms === undefined ? "" : `${(l.for_ms / 1000).toFixed(1)} s`)],
      ["calls in flight", "in_flight"], ["drops", "drops"], ["drops while failing", "failing_drops"],
    ], "link"));
    const mc = c.moves_in_cluster;
    const flying = (mc?.in_progress || []).map((m) => ({ ...m, move: `${m.tube}#${m.partition}` }));
    parts.push(heading(`Moves in flight in the cluster (${mc ? flying.length : "asking the primaries"})`), table(flying, [
      ["move", "move"], ["tube", "tube"], ["partition", "partition"],
      ["from", "from"], ["to", "to"], ["step", "phase"], ["tasks sent", "tasks_sent"],
      ["tasks here", "tasks_here"], ["for", (m) => `${(m.elapsed_ms / 1000).toFixed(1)} s`],
      ["frozen", (m) => (m.frozen ? "frozen" : "")],
    ], "move"));
    parts.push(heading("Moves by replica set"), table(mc?.sets || [], [
      ["replica set", "set"], ["in progress", (x) => (x.in_progress ? `${x.in_progress.tube}#${x.in_progress.partition} to ${x.in_progress.to}` : "")],
      ["committed", "committed"], ["given up", "given_up"], ["tasks moved", "tasks_moved"],
      ["last (ms)", "last_ms"], ["error", "error"],
    ], "moveSet"));
    if (c.moves) {
      parts.push(heading("Moves run by this node"), kv({
        in_progress: c.moves.in_progress ? `${c.moves.in_progress.tube} #${c.moves.in_progress.partition} to ${c.moves.in_progress.to}: ${c.moves.in_progress.tasks} tasks sent` : "none",
        committed: c.moves.committed, given_up: c.moves.given_up, tasks_moved: c.moves.tasks_moved, last_ms: c.moves.last_ms,
      }));
    }
  }
  $("#cluster").replaceChildren(...parts);
  $("#server-info").replaceChildren(kv({ version: s.version, uptime: `${Math.round(s.uptime)} s`, ...s.connections, wal: s.wal.mode, read_only: s.read_only }));
}

// ---- views ----

let refreshing = null;
function refresh() {
  if (refreshing) return refreshing;
  state.tableDue = Date.now() + 2000;
  const work = state.view === "overview" ? renderTubes()
    : state.view === "tube" ? renderTube()
      : renderCluster();
  refreshing = work.catch((e) => say(e.message, "error")).finally(() => { refreshing = null; });
  return refreshing;
}

function refreshSoon() {
  state.tableDue = 0;
  setTimeout(refresh, 50);
}

async function route() {
  const hash = location.hash || "#/";
  const m = hash.match(/^#\/tube\/(.+)$/);
  state.view = m ? "tube" : hash === "#/cluster" ? "cluster" : "overview";
  if (m) {
    const name = decodeURIComponent(m[1]);
    if (name !== state.tube) { state.taskStatus = "ready"; state.taskAfter = null; state.found = null; }
    state.tube = name;
  }
  for (const v of ["overview", "tube", "cluster"]) $(`#view-${v}`).hidden = v !== state.view;
  document.querySelectorAll("[data-nav]").forEach((a) => {
    if (a.dataset.nav === state.view) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  });
  if (state.view === "overview" && state.history) {
    draw("chart-rates", state.history.rates, RATES);
    draw("chart-counts", state.history.counts, COUNTS);
  }
  if (state.view === "tube") await loadTubeHistory().catch((e) => say(e.message, "error"));
  await refresh();
}

async function start() {
  try {
    const s = await api("/api/server");
    state.readOnly = s.read_only;
    state.readOnlyWhy = s.read_only ? "read-only: start tarq with --user and --password to act" : "";
    state.you = s.you || state.you;
    const who = state.you.user === null ? "" : ` · ${state.you.user}`;
    $("#server").textContent = `tarq ${s.version}` + (s.read_only ? " · read-only" : who);
    // Creating a tube needs `admin` on it: the cluster's, or on every tube (`*`).
    $("#create").hidden = !s.read_only && !(state.you.every_tube || []).includes("admin");
  } catch (e) {
    say(e.message, "error");
  }
  $("#create").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    act(`create ${f.get("name")}`, "/api/tubes", { name: f.get("name"), type: f.get("type") });
  });
  $("#create button").disabled = state.readOnly;
  $("#create button").title = state.readOnlyWhy;
  $("#put").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const body = { data: f.get("data") };
    if (f.get("delay")) body.delay = Number(f.get("delay"));
    act("put", `/api/tubes/${encodeURIComponent(state.tube)}/tasks`, body);
  });
  $("#find").addEventListener("submit", (ev) => {
    // A task by id, whichever partition (and node) holds it: shown until a tab is chosen.
    ev.preventDefault();
    state.found = new FormData(ev.target).get("id");
    renderTasks(false);
  });
  $("#filter").addEventListener("input", (ev) => { state.filter = ev.target.value; refreshSoon(); });
  $("#more").addEventListener("click", () => renderTasks(true));
  window.addEventListener("hashchange", route);
  // The theme changed: charts take their colours when drawn, so they are drawn anew.
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    for (const c of Object.values(state.charts)) c.destroy();
    state.charts = {};
    route();
  });
  window.addEventListener("resize", () => {
    for (const [id, c] of Object.entries(state.charts)) {
      const el = document.getElementById(id);
      if (el && el.clientWidth > 0) c.setSize({ width: Math.max(300, el.clientWidth - 4), height: 220 });
    }
  });
  await loadHistory().catch((e) => say(e.message, "error"));
  await route();
  listen();
  document.body.dataset.ready = "true";
}

start();
