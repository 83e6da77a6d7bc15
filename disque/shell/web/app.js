// The dashboard: polls /api/overview every second and renders it; no build step.
"use strict";

const POLL_MS = 1000;
let previous = null; // the last overview and when it came, for the in/out rates

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function renderNodes(nodes) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of nodes) {
    const row = body.insertRow();
    row.dataset.node = n.id;
    cell(row, n.id.slice(0, 8) + (n.myself ? " (this node)" : ""));
    cell(row, n.addr);
    cell(row, n.flags, /fail/.test(n.flags) ? "down" : "");
    cell(row, n.myself ? "-" : n.link ? "connected" : "disconnected", n.myself ? "" : n.link ? "up" : "down");
  }
}

function renderQueues(queues, rates) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  for (const q of queues.sort((a, b) => a.name.localeCompare(b.name))) {
    const row = body.insertRow();
    row.dataset.queue = q.name;
    const rate = rates[q.name] || { in: 0, out: 0 };
    cell(row, q.name);
    cell(row, q.len, "num len");
    cell(row, rate.in.toFixed(1), "num");
    cell(row, rate.out.toFixed(1), "num");
    cell(row, q.blocked, "num");
    cell(row, (q.oldest_age_ms / 1000).toFixed(0), "num");
    cell(row, q.nacks, "num");
    cell(row, q.pause, "pause");
    const button = document.createElement("button");
    const paused = q.pause !== "none";
    button.textContent = paused ? "resume" : "pause";
    button.className = "toggle";
    button.onclick = () => setPause(q.name, paused ? "none" : "in");
    row.insertCell().append(button);
  }
}

function rates(now, overview) {
  const out = {};
  if (!previous) return out;
  const seconds = (now - previous.at) / 1000;
  const before = Object.fromEntries(previous.overview.queues.map((q) => [q.name, q]));
  for (const q of overview.queues) {
    const b = before[q.name];
    if (b && seconds > 0) out[q.name] = { in: (q.jobs_in - b.jobs_in) / seconds, out: (q.jobs_out - b.jobs_out) / seconds };
  }
  return out;
}

async function poll() {
  try {
    const response = await fetch("/api/overview");
    const overview = await response.json();
    const now = Date.now();
    document.getElementById("me").textContent = "node " + overview.node_id.slice(0, 8);
    document.getElementById("status").textContent = "updated " + new Date(now).toLocaleTimeString();
    document.getElementById("jobs").replaceChildren(
      ...Object.entries(overview.jobs).map(([state, n]) => {
        const span = document.createElement("span");
        span.textContent = `${state}: ${n}`;
        span.dataset.state = state;
        return span;
      }),
    );
    renderNodes(overview.nodes);
    renderQueues(overview.queues, rates(now, overview));
    previous = { at: now, overview };
  } catch (e) {
    document.getElementById("status").textContent = "node unreachable: " + e;
  }
}

async function setPause(queue, state) {
  const headers = { "content-type": "application/json" };
  const password = document.getElementById("password").value;
  if (password) headers.authorization = "Bearer " + password;
  const response = await fetch(`/api/queues/${encodeURIComponent(queue)}/pause`, {
    method: "POST", headers, body: JSON.stringify({ state }),
  });
  const reply = await response.json();
  document.getElementById("pause-result").textContent = response.ok ? `${queue}: pause ${reply.pause}` : reply.error;
  poll();
}

document.getElementById("lookup").onsubmit = async (event) => {
  event.preventDefault();
  const id = document.getElementById("job-id").value.trim();
  const body = document.querySelector("#job tbody");
  body.replaceChildren();
  const response = await fetch("/api/jobs/" + encodeURIComponent(id));
  const reply = await response.json();
  const fields = reply.error ? { error: reply.error } : reply.job || { result: "no such job on this node" };
  for (const [key, value] of Object.entries(fields)) {
    const row = body.insertRow();
    row.dataset.field = key;
    cell(row, key);
    cell(row, Array.isArray(value) ? value.join(" ") : String(value));
  }
};

poll();
setInterval(poll, POLL_MS);
