// The dashboard: polls /api/cluster (every node's overview, gathered by this
// node) every second and /api/cluster/history every 10 s; no build step.
"use strict";

const POLL_MS = 1000;
const HISTORY_MS = 10000;
const RATE_WINDOW_MS = 5000; // in/s and out/s: the counters' growth over the last few seconds
const LEVELS = ["ok", "warning", "oom"];
let samples = []; // [{at, counters: {node: {queue: [in, out]}}}], the last RATE_WINDOW_MS
let history = null; // the cluster's rate history, added up over the nodes

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function short(id) {
  return id.slice(0, 8);
}

function bytes(n) {
  if (!n) return "0";
  const units = ["B", "K", "M", "G", "T"];
  const i = Math.min(units.length - 1, Math.floor(Math.log(n) / Math.log(1024)));
  return (n / 1024 ** i).toFixed(i ? 1 : 0) + units[i];
}

function fill(selector, rows, render) {
  const body = document.querySelector(selector + " tbody");
  body.replaceChildren();
  for (const item of rows) render(body.insertRow(), item);
}

// A line of figures: a span `label: value` per [name, value], its name in data-<attr> (what the tests read).
function figures(id, entries, attr, label = (name) => name) {
  document.getElementById(id).replaceChildren(
    ...entries.map(([name, value]) => {
      const span = document.createElement("span");
      span.textContent = `${label(name)}: ${value}`;
      span.dataset[attr] = name;
      return span;
    }),
  );
}

function words(name) {
  return name.replaceAll("_", " ");
}

// ------------------------------------------------------------ merging

function mergeQueues(live) {
  const queues = {};
  for (const node of live) {
    for (const q of node.overview.queues) {
      const m = (queues[q.name] ||= { name: q.name, len: 0, byNode: [], blocked: 0, oldest: 0, nacks: 0, pause: "none" });
      m.len += q.len;
      m.byNode.push(q.len);
      m.blocked += q.blocked;
      m.oldest = Math.max(m.oldest, q.oldest_age_ms);
      m.nacks += q.nacks;
      if (node.myself || m.pause === "none") m.pause = q.pause; // PAUSE ... BCAST: every node has the same
    }
  }
  return Object.values(queues).sort((a, b) => a.name.localeCompare(b.name));
}

function rates(now, live) {
  const counters = {};
  for (const node of live) {
    counters[node.id] = Object.fromEntries(node.overview.queues.map((q) => [q.name, [q.jobs_in, q.jobs_out]]));
  }
  samples.push({ at: now, counters });
  samples = samples.filter((s) => now - s.at <= RATE_WINDOW_MS);
  const first = samples[0];
  const seconds = (now - first.at) / 1000;
  const out = {};
  if (seconds <= 0) return out;
  for (const [node, queues] of Object.entries(counters)) {
    const before = first.counters[node];
    if (!before) continue; // the node did not answer then
    for (const [name, [jobsIn, jobsOut]] of Object.entries(queues)) {
      const b = before[name] || [0, 0]; // a queue made since counts from zero
      if (jobsIn < b[0] || jobsOut < b[1]) continue; // made again
      const r = (out[name] ||= { in: 0, out: 0 });
      r.in += (jobsIn - b[0]) / seconds;
      r.out += (jobsOut - b[1]) / seconds;
    }
  }
  return out;
}

// ------------------------------------------------------------ charts

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

// A line chart of per-slot counts as rates: `series` [[values, class]], values oldest first.
function chart(series, width, height, axis) {
  const box = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "history" });
  const step = history ? history.slot_seconds : 10;
  const top = Math.max(1, ...series.flatMap(([values]) => values)) / step;
  const pad = axis ? 14 : 1;
  for (const [values, cls] of series) {
    if (!values.length) continue;
    const x = (i) => (i * (width - 2)) / Math.max(1, values.length - 1) + 1;
    const y = (v) => height - pad - ((v / step) * (height - pad - 2)) / top;
    box.append(svg("polyline", { points: values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" "), class: cls }));
  }
  if (axis) {
    box.append(svg("line", { x1: 0, x2: width, y1: height - pad, y2: height - pad, class: "axis" }));
    for (const [label, at, anchor] of [["-60 min", 0, "start"], ["-30 min", width / 2, "middle"], ["now", width, "end"]]) {
      const text = svg("text", { x: at, y: height - 2, "text-anchor": anchor, class: "axis" });
      text.textContent = label;
      box.append(text);
    }
    const peak = svg("text", { x: 4, y: 12, class: "axis" });
    peak.textContent = `${top.toFixed(top < 10 ? 1 : 0)} jobs/s`;
    box.append(peak);
  }
  return box;
}

function sum(windows) {
  const width = windows.length ? windows[0].in.length : 0;
  const total = { in: new Array(width).fill(0), out: new Array(width).fill(0) };
  for (const w of windows) {
    for (let i = 0; i < width; i++) {
      total.in[i] += w.in[i];
      total.out[i] += w.out[i];
    }
  }
  return total;
}

function renderChart() {
  const box = document.getElementById("chart");
  if (!history) return;
  const total = sum([history.other, ...Object.values(history.queues)]);
  box.replaceChildren(chart([[total.in, "in"], [total.out, "out"]], 720, 140, true));
}

async function pollHistory() {
  try {
    history = (await (await fetch("/api/cluster/history")).json()).history;
    renderChart();
  } catch (e) {
    history = null;
  }
}

// ------------------------------------------------------------ tables

function renderNodes(me, byId) {
  fill("#nodes", me.overview.nodes, (row, n) => {
    const answer = byId[n.id];
    const fig = answer && answer.overview;
    row.dataset.node = n.id;
    cell(row, short(n.id) + (n.myself ? " (this node)" : ""));
    cell(row, n.addr);
    cell(row, n.flags, /fail/.test(n.flags) ? "down" : "");
    cell(row, n.myself ? "-" : n.link ? "connected" : "disconnected", n.myself ? "" : n.link ? "up" : "down");
    cell(row, fig ? "ok" : answer ? "unreachable: " + answer.error : "not asked", fig ? "up" : "down");
    cell(row, fig ? fig.jobs.queued : "", "num");
    cell(row, fig ? fig.jobs.active : "", "num");
    cell(row, fig ? fig.clients : "", "num");
    cell(row, fig ? fig.blocked_clients : "", "num");
    cell(row, n.zone || "-");
  });
}

function renderTotals(live, queues, rate) {
  const jobs = {};
  let clients = 0, blocked = 0, dead = 0;
  for (const { overview } of live) {
    for (const [state, n] of Object.entries(overview.jobs)) jobs[state] = (jobs[state] || 0) + n;
    clients += overview.clients;
    blocked += overview.blocked_clients;
    dead += overview.dead_letters.reduce((n, q) => n + q.len, 0);
  }
  figures("jobs", Object.entries(jobs), "state");
  const flow = Object.values(rate).reduce((t, r) => ({ in: t.in + r.in, out: t.out + r.out }), { in: 0, out: 0 });
  const totals = { queues: queues.length, "in/s": flow.in.toFixed(1), "out/s": flow.out.toFixed(1), "dead letters": dead, clients, blocked };
  figures("totals", Object.entries(totals), "total");
}

function renderQueues(queues, rate) {
  fill("#queues", queues, (row, q) => {
    row.dataset.queue = q.name;
    const r = rate[q.name] || { in: 0, out: 0 };
    cell(row, q.name);
    cell(row, q.len, "num len");
    cell(row, q.byNode.join(" / "), "muted");
    cell(row, r.in.toFixed(1), "num rate-in");
    cell(row, r.out.toFixed(1), "num rate-out");
    cell(row, q.blocked, "num");
    cell(row, (q.oldest / 1000).toFixed(0), "num");
    cell(row, q.nacks, "num");
    cell(row, q.pause, "pause");
    const button = document.createElement("button");
    const paused = q.pause !== "none";
    button.textContent = paused ? "resume" : "pause";
    button.className = "toggle";
    button.onclick = () => setPause(q.name, paused ? "none" : "in");
    row.insertCell().append(button);
    const spark = row.insertCell();
    spark.className = "spark";
    const h = history && history.queues[q.name];
    if (h) spark.append(chart([[h.in, "in"], [h.out, "out"]], 120, 22, false));
  });
}

function errorsOf(q) {
  return [...q.errors.entries()].sort(([a], [b]) => a.localeCompare(b));
}

function renderDeadLetters(live) {
  const queues = {};
  for (const node of live) {
    for (const q of node.overview.dead_letters) {
      const m = (queues[q.name] ||= { name: q.name, len: 0, byNode: [], from: new Set(), errors: new Map(), oldest: null });
      m.len += q.len;
      m.byNode.push(`${short(node.id)}: ${q.len}`);
      for (const job of q.jobs) {
        m.from.add(job.from || "?");
        if (job.error && !m.errors.has(job.error)) m.errors.set(job.error, job);  // the first job of each error type
      }
      const first = q.jobs[0];
      if (first && (!m.oldest || first.age_ms > m.oldest.age_ms)) m.oldest = first;
    }
  }
  fill("#deadletters", Object.values(queues).sort((a, b) => a.name.localeCompare(b.name)), (row, q) => {
    row.dataset.queue = q.name;
    // The error first, as Flower shows a failed task: each type with the message of its oldest job; a click shows that job.
    const errors = row.insertCell();
    errors.className = "error";
    for (const [type, job] of errorsOf(q)) {
      const link = document.createElement("a");
      link.href = "#job";
      link.textContent = `${type}: ${job.message}`;
      link.title = job.id;
      link.onclick = () => lookup(job.id);
      errors.append(link, document.createElement("br"));
    }
    if (!q.errors.size) errors.textContent = "(no error reported)";
    cell(row, q.name);
    cell(row, q.len, "num len");
    cell(row, q.byNode.join(", "), "muted");
    cell(row, [...q.from].join(", "));
    cell(row, q.oldest ? `${q.oldest.id.slice(0, 12)}… ${q.oldest.body}` : "", "body");
    const button = document.createElement("button");
    button.textContent = "requeue";
    button.className = "requeue";
    button.onclick = () => requeue(q.name);
    row.insertCell().append(button);
  });
}

function renderGroups(live) {
  // Each holder of a queue's events keeps every group's progress: the most any node saw; consumers wait on each node.
  const groups = {};
  for (const { overview } of live) {
    for (const g of overview.groups) {
      const key = g.queue + "\u0000" + g.group;
      const m = (groups[key] ||= { queue: g.queue, group: g.group, total: 0, inprogress: 0, redo: 0, done: 0, available: 0, consumers: 0 });
      for (const f of ["total", "inprogress", "redo", "done", "available"]) m[f] = Math.max(m[f], g[f]);
      m.consumers += g.consumers;
    }
  }
  fill("#groups", Object.values(groups), (row, g) => {
    row.dataset.group = g.group;
    cell(row, g.queue);
    cell(row, g.group);
    for (const f of ["total", "inprogress", "redo", "done", "available", "consumers"]) cell(row, g[f], "num");
  });
}

function renderLimits(live) {
  // Limits are cluster state; each node reports its own use of them (core/limits.py figures()).
  const limits = {};
  for (const { overview } of live) {
    for (const l of overview.limit_list || []) {
      const m = (limits[l.queue] ||= { ...l, out: 0, handed: 0, waiting: 0, waited_seconds: 0 });
      m.out += l.out;
      m.handed += l.handed;
      m.waiting += l.waiting;
      m.waited_seconds += l.waited_seconds;
    }
  }
  fill("#limits", Object.values(limits), (row, l) => {
    row.dataset.queue = l.queue;
    cell(row, l.queue);
    cell(row, l.rate_per_second || "", "num");
    cell(row, l.concurrency || "", "num");
    for (const f of ["out", "handed"]) cell(row, l[f], "num");
    cell(row, l.waiting ? `${l.waiting} node(s)` : "", l.waiting ? "down" : "muted");
    cell(row, l.waited_seconds.toFixed(1), "num");
  });
}

function renderWorkflows(live) {
  // INFO workflows of every node, added up (a batch is known to every node: the largest count).
  const totals = { jobs_held: 0, jobs_released: 0, parents_failed: 0, batches: 0, batch_callbacks_fired: 0, results_kept: 0 };
  for (const { overview } of live) {
    for (const name of Object.keys(totals)) {
      const n = overview.workflows[name];
      totals[name] = name === "batches" ? Math.max(totals[name], n) : totals[name] + n;
    }
  }
  figures("workflow-totals", Object.entries(totals), "figure", words);
}

const TOP_KEYS = 5; // each node lists its queues' 5 busiest keys (core/figures.py TOP_KEYS)
const DEDUP = ["dedup_hits", "dedup_granted", "dedup_unconfirmed", "dedup_released"];

function renderKeys(live) {
  // Each node's queues with keyed jobs (core/figures.py key_figures), added up: a key queued on two nodes counts on each.
  const queues = {};
  const dedup = Object.fromEntries(DEDUP.map((name) => [name, 0]));
  for (const { id, overview } of live) {
    for (const q of overview.key_list || []) { // (a node of an older version lists none)
      const m = (queues[q.queue] ||= { queue: q.queue, keys: 0, jobs: 0, byNode: [], busiest: {} });
      m.keys += q.keys;
      m.jobs += q.jobs;
      m.byNode.push(`${short(id)}: ${q.keys}`);
      for (const [key, n] of q.busiest) m.busiest[key] = (m.busiest[key] || 0) + n;
    }
    for (const name of DEDUP) dedup[name] += (overview.keys || {})[name] || 0;
  }
  const rows = Object.values(queues).sort((a, b) => b.jobs - a.jobs || a.queue.localeCompare(b.queue));
  fill("#keys", rows, (row, q) => {
    row.dataset.queue = q.queue;
    cell(row, q.queue);
    cell(row, q.keys, "num");
    cell(row, q.jobs, "num");
    cell(row, q.byNode.join(", "), "muted");
    const busiest = Object.entries(q.busiest).sort(([a, x], [b, y]) => y - x || (a < b ? -1 : a > b ? 1 : 0)).slice(0, TOP_KEYS);
    cell(row, busiest.map(([key, n]) => `${key}: ${n}`).join(", "), "busiest");
  });
  figures("key-totals", Object.entries(dedup), "figure", words);
}

function renderSchedules(me, live) {
  // Schedules are cluster state: this node's definitions, with the latest tick any node knows fired.
  const latest = {};
  const queues = {};  // each schedule's queue on every node: jobs, consumers waiting, last taken, oldest
  for (const { overview } of live) {
    for (const s of overview.schedule_list) {
      if (s["last-tick"] && !(s["last-tick"] <= (latest[s.name] || {})["last-tick"])) latest[s.name] = s;
      const q = (queues[s.name] ||= { jobs: 0, waiting: 0, fetched: 0, oldest: 0 });
      q.jobs += s["queue-len"] || 0;
      q.waiting += s["queue-waiting"] || 0;
      q.fetched = Math.max(q.fetched, s["queue-fetched"] || 0);
      if (s["queue-oldest"] && (!q.oldest || s["queue-oldest"] < q.oldest)) q.oldest = s["queue-oldest"];
    }
  }
  const time = (ms) => (ms ? new Date(ms).toLocaleTimeString() : "");
  fill("#schedules", me.overview.schedule_list, (row, s) => {
    const last = latest[s.name] || s;
    row.dataset.schedule = s.name;
    cell(row, s.name);
    cell(row, s.queue);
    cell(row, s.every ? `every ${s.every / 1000} s` : `${s.cron}${s.tz ? " " + s.tz : ""}`, "when");
    cell(row, s.options, "muted");
    cell(row, s.paused ? "paused" : "running", s.paused ? "down" : "up");
    cell(row, time(last["last-tick"]), "last");
    cell(row, last["last-node"] ? short(last["last-node"]) : "", "muted");
    cell(row, time(s["next-tick"]), "next");
    // Its worker gone: jobs pile up with nobody waiting and none taken since the oldest was made (docs/schedules.md).
    const q = queues[s.name] || { jobs: 0, waiting: 0, fetched: 0, oldest: 0 };
    const stalled = q.jobs >= 2 && !q.waiting && (!q.fetched || q.fetched < q.oldest);
    cell(row, q.jobs, "num jobs");
    const taken = q.fetched ? `last taken ${time(q.fetched)}` : "";
    const consumer = q.waiting ? `${q.waiting} waiting` : stalled ? `NONE: jobs pile up${taken ? ", " + taken : ""}` : taken;
    cell(row, consumer, stalled ? "consumer down" : "consumer muted");
  });
  const totals = {};
  for (const { overview } of live) {
    for (const name of ["fired", "late", "collapsed", "refused"]) {
      totals[name] = (totals[name] || 0) + overview.schedules["schedule_ticks_" + name];
    }
  }
  figures("schedule-totals", Object.entries(totals), "ticks", (name) => `ticks ${name}`);
}

function renderClients(live) {
  const rows = live.flatMap((node) => node.overview.clients_shown.map((c) => ({ node: node.id, ...c })));
  fill("#clients", rows, (row, c) => {
    row.dataset.name = c.name;
    cell(row, short(c.node));
    cell(row, c.addr);
    cell(row, c.name);
    cell(row, c.lib);
    cell(row, c.age_s, "num");
    cell(row, c.idle_s, "num");
    cell(row, c.cmd);
    cell(row, c.queues.join(" "), "waiting");
  });
}

function renderHealth(live) {
  fill("#health", live, (row, node) => {
    const o = node.overview;
    const rb = o.read_behind;
    row.dataset.node = node.id;
    cell(row, short(node.id));
    cell(row, bytes(o.used_memory), "num");
    cell(row, bytes(o.memory.used_memory_rss), "num");
    cell(row, bytes(o.memory.used_memory_startup), "num");
    cell(row, o.maxmemory ? bytes(o.maxmemory) : "none", "num");
    cell(row, LEVELS[o.mem_level], o.mem_level ? "down" : "up");
    const aof = o.aof.aof_enabled ? `on, last write ${o.aof.aof_last_write_status}` + (o.aof.aof_rewrite_in_progress ? ", rewriting" : "") : "off";
    cell(row, aof, o.aof.aof_last_write_status === "ok" ? "" : "down");
    cell(row, o.aof.aof_enabled ? bytes(o.aof.aof_current_size) : "", "num");
    const disk = rb.read_behind === "no" ? "off" : `${rb.jobs_on_disk} jobs on disk` + (rb.read_behind_error ? ", error: " + rb.read_behind_error : "");
    cell(row, disk, rb.read_behind_error ? "down" : "");
  });
}

// ------------------------------------------------------------ polling and actions

async function poll() {
  try {
    const reply = await (await fetch("/api/cluster")).json();
    const now = Date.now();
    const live = reply.nodes.filter((n) => n.overview);
    const me = reply.nodes.find((n) => n.myself);
    const byId = Object.fromEntries(reply.nodes.map((n) => [n.id, n]));
    const queues = mergeQueues(live);
    const rate = rates(now, live);
    document.getElementById("me").textContent = "node " + short(me.id);
    document.getElementById("reach").textContent = `${live.length} of ${reply.nodes.length} nodes answering`;
    document.getElementById("status").textContent = "updated " + new Date(now).toLocaleTimeString();
    renderNodes(me, byId);
    renderTotals(live, queues, rate);
    renderQueues(queues, rate);
    renderDeadLetters(live);
    renderGroups(live);
    renderSchedules(me, live);
    renderLimits(live);
    renderWorkflows(live);
    renderKeys(live);
    renderClients(live);
    renderHealth(live);
  } catch (e) {
    document.getElementById("status").textContent = "node unreachable: " + e;
  }
}

function authorized() {
  const headers = { "content-type": "application/json" };
  const password = document.getElementById("password").value;
  if (password) headers.authorization = "Bearer " + password;
  return headers;
}

async function setPause(queue, state) {
  const response = await fetch(`/api/queues/${encodeURIComponent(queue)}/pause`, {
    method: "POST", headers: authorized(), body: JSON.stringify({ state }),
  });
  const reply = await response.json();
  document.getElementById("pause-result").textContent = response.ok ? `${queue}: pause ${reply.pause}` : reply.error;
  poll();
}

async function requeue(queue) {
  const out = document.getElementById("requeue-result");
  out.textContent = `${queue}: requeueing…`;
  const response = await fetch(`/api/deadletters/${encodeURIComponent(queue)}/requeue`, {
    method: "POST", headers: authorized(), body: JSON.stringify({ scope: "cluster" }),
  });
  const reply = await response.json();
  if (!response.ok) {
    out.textContent = `${queue}: ${reply.error}`;
  } else {
    const nodes = reply.nodes.map((n) => `${short(n.id)}: ${"requeued" in n ? n.requeued : n.error}`).join(", ");
    out.textContent = `${queue}: ${reply.requeued} requeued (${nodes})`;
  }
  poll();
}

document.getElementById("lookup").onsubmit = (event) => {
  event.preventDefault();
  lookup(document.getElementById("job-id").value.trim());
};

async function lookup(id) {
  document.getElementById("job-id").value = id;
  const body = document.querySelector("#job tbody");
  body.replaceChildren();
  const response = await fetch("/api/jobs/" + encodeURIComponent(id));
  const reply = await response.json();
  const fields = reply.error ? { error: reply.error } : reply.job ? { node: short(reply.node), ...reply.job } : { result: "no node knows this job" };
  for (const [key, value] of Object.entries(fields)) {
    const row = body.insertRow();
    row.dataset.field = key;
    cell(row, key);
    cell(row, Array.isArray(value) ? value.join(" ") : String(value), key.startsWith("error-") ? "error" : "");
  }
}

poll();
pollHistory();
setInterval(poll, POLL_MS);
setInterval(pollHistory, HISTORY_MS);
