// The live page: polls /api/status once a second with the viewer's token
// and redraws. Everything it shows comes from the server's status
// (proto ClusterStatus, as protobuf's JSON mapping: 64-bit numbers arrive
// as strings, absent fields are zero) and its history of samples.
"use strict";

const POLL_MS = 1000;
const num = (x) => Number(x || 0);
let token = null;
let charts = {};
let lastRecovery = null;
let lastWorkers = new Map();
let updates = 0;

function readToken() {
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) {
    sessionStorage.setItem("plexus-token", hash.get("token"));
    history.replaceState(null, "", location.pathname);  // off the URL bar
  }
  return sessionStorage.getItem("plexus-token");
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) {
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function table(id, caption, headers, rows, empty) {
  const t = document.getElementById(id);
  t.replaceChildren();
  t.append(el("caption", {}, caption));
  if (rows.length === 0) {
    t.append(el("tr", {}, el("td", {class: "muted"}, empty)));
    return;
  }
  t.append(el("tr", {}, ...headers.map((h) => el("th", {}, h))));
  for (const r of rows) {
    t.append(el("tr", r.attrs || {}, ...r.cells.map((c) =>
      c instanceof Node ? el("td", {}, c) : el("td", {}, c))));
  }
}

function human(n) {
  n = num(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}

function seconds(micros) { return (num(micros) / 1e6).toFixed(2) + " s"; }

function span(cls, text) { return el("span", {class: cls}, text); }

// ------------------------------------------------------------------ charts

const PALETTE = ["#3266cc", "#dc3912", "#ff9900", "#109618", "#990099",
                 "#0099c6", "#dd4477", "#66aa00", "#b82e2e", "#316395"];

function lineChart(id, title, yLabel, yMax, yTick) {
  return new Chart(document.getElementById(id), {
    type: "line",
    data: {labels: [], datasets: []},
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      elements: {point: {radius: 0}, line: {borderWidth: 1.5}},
      plugins: {title: {display: true, text: title},
                legend: {position: "bottom", labels: {boxWidth: 10}}},
      scales: {x: {title: {display: true, text: "seconds ago"},
                   ticks: {maxTicksLimit: 7}},
               y: {beginAtZero: true, max: yMax,
                   ticks: yTick ? {callback: yTick} : {},
                   title: {display: true, text: yLabel}}},
    },
  });
}

function setSeries(chart, labels, series) {
  chart.data.labels = labels;
  chart.data.datasets = series.map((s, i) => ({
    label: s.label, data: s.data, spanGaps: false,
    borderColor: PALETTE[i % PALETTE.length],
    backgroundColor: PALETTE[i % PALETTE.length],
  }));
  chart.update();
}

// Per-second rates of a cumulative series `v` at times `t` (ms): one fewer
// point than samples; null across a gap or a restart (counter went down).
function rates(t, v, scale) {
  const out = [];
  for (let i = 1; i < t.length; i++) {
    const dt = (t[i] - t[i - 1]) / 1000;
    if (v[i] == null || v[i - 1] == null || dt <= 0 || v[i] < v[i - 1]) {
      out.push(null);
    } else {
      out.push((v[i] - v[i - 1]) / dt * (scale || 1));
    }
  }
  return out;
}

function drawCharts(h, now, workers) {
  const t = h.t.map(Number);
  const ago = t.slice(1).map((x) => Math.round((x - now) / 1000));
  const hostOf = (key) => {
    const [w, d] = key.split("/");
    const ws = workers.get(w);
    return (ws ? ws.host_name : "worker " + w) + ":" + d;
  };
  const devices = Object.entries(h.devices);
  setSeries(charts.busy, ago, devices.map(([k, d]) => ({
    label: hostOf(k),
    data: rates(t, d.busy_micros.map((x) => x == null ? null : Number(x)),
                100 / 1e6),
  })));
  setSeries(charts.memory, ago, devices.map(([k, d]) => ({
    label: hostOf(k) + " (of " + human(d.memory_bytes) + ")",
    data: d.live_bytes.slice(1).map((x) => x == null ? null : Number(x)),
  })));
  setSeries(charts.calls, ago, [
    {label: "calls routed / s", data: rates(t, h.calls_routed.map(Number))},
    {label: "calls waiting > 1 s", data: h.calls_waiting.slice(1).map(Number)},
  ]);
  // Bytes per second by path, summed over hosts (each host's are in
  // /metrics' plexus_transfer_bytes_total).
  setSeries(charts.transfers, ago, Object.entries(h.transfer_bytes).map(
    ([path, v]) => ({label: path.replace(/_/g, " "),
                     data: rates(t, v.map(Number))})));
}

// ------------------------------------------------------------------ tables

function drawWhy(st) {
  const ul = document.getElementById("why");
  ul.replaceChildren();
  const names = new Map((st.clients || []).map((c) => [c.client_id, c.name]));
  const entries = st.why || [];
  for (const e of entries) {
    const who = "client " + e.client_id + " (" + (names.get(e.client_id) || "?") + "): ";
    const li = el("li", {"data-call": e.call_id},
                  el("b", {}, (num(e.waited_ms) / 1000).toFixed(1) + " s "),
                  who, e.reason);
    if (e.blame_host) li.append(" ", span("warn", "[host " + e.blame_host + "]"));
    ul.append(li);
  }
  for (const p of st.pending_slices || []) {
    ul.append(el("li", {}, "client " + p.client_id + "'s request for " + num(p.num_devices) +
                 " device(s) has waited " + (num(p.waited_ms) / 1000).toFixed(1) +
                 " s: waiting for " + p.waiting_for));
  }
  if (!ul.children.length) {
    ul.append(el("li", {class: "none"}, "nothing has waited longer than 1 s"));
  }
}

function drawHosts(st, h, now) {
  const busy = new Map();
  const t = h.t.map(Number);
  for (const [k, d] of Object.entries(h.devices)) {
    const r = rates(t, d.busy_micros.map((x) => x == null ? null : Number(x)), 100 / 1e6);
    busy.set(k, r.length ? r[r.length - 1] : null);
  }
  const rows = [];
  for (const w of st.workers || []) {
    const s = w.stats || {};
    const state = !w.alive ? span("bad", "down: " + (w.down_reason || "?"))
                : w.spare ? span("muted", "spare") : span("ok", "alive");
    const devs = (w.devices || []).map((d) => {
      const i = num(d.index);
      const b = busy.get(w.worker_id + "/" + i);
      const live = (s.device_live_bytes || [])[i];
      const queued = num((s.device_tasks_pending || [])[i]);
      return i + ": " + (b == null ? "–" : b.toFixed(0) + "% busy") + ", " +
             human(live) + " / " + human(d.memory_bytes) +
             (queued ? ", " + queued + " tasks pending" : "");
    }).join("; ");
    rows.push({attrs: {"data-host": w.host_name},
               cells: [w.worker_id, w.host_name, state, devs,
                       num(s.calls_executed), num(s.calls_failed),
                       num(s.xla_compiles), human(s.bytes_sent)]});
  }
  table("hosts", "Hosts", ["worker", "host", "state", "devices",
        "calls", "failed", "compiles", "sent"], rows, "no workers registered");
}

function drawClients(st) {
  const rows = (st.clients || []).map((c) => ({
    attrs: {"data-client": c.client_id},
    cells: [c.client_id, c.name, c.tenant, num(c.weight || 1),
            num(c.slices), num(c.calls_pending), num(c.calls_in_flight),
            num(c.calls_admitted), seconds(c.device_micros), human(c.live_bytes)]}));
  table("clients", "Clients", ["id", "name", "tenant", "weight", "slices",
        "pending", "in flight", "admitted", "device time", "live"], rows,
        "no clients connected");
  const slices = (st.slices || []).map((s) => {
    const state = s.broken ? span("bad", "broken: " + s.broken)
                : s.awaiting ? span("warn", "awaiting a host")
                : span("ok", "ok");
    const devs = (s.devices || []).map((d) => d.host_name + ":" + num(d.device)).join(", ");
    return {attrs: {"data-slice": s.slice_id},
            cells: [s.slice_id, s.client_id, (s.devices || []).length, devs,
                    num(s.generation), state]};
  });
  table("slices", "Slices", ["slice", "client", "devices", "map",
        "remaps", "state"], slices, "no slices granted");
  const pending = (st.pending_slices || []).map((p) => ({
    cells: [p.client_id, num(p.num_devices), (num(p.waited_ms) / 1000).toFixed(1) + " s",
            (num(p.left_ms) / 1000).toFixed(1) + " s", p.waiting_for]}));
  table("pending", "Slice requests waiting for capacity",
        ["client", "devices", "waited", "left", "waiting for"], pending,
        "none waiting");
}

function drawGraphs(st) {
  const names = new Map((st.clients || []).map((c) => [c.client_id, c.name]));
  const rows = (st.graphs || []).map((g) => ({
    attrs: {"data-graph": g.client_id + "/" + g.graph_id},
    cells: [g.graph_id, g.client_id + " (" + (names.get(g.client_id) || "?") + ")",
            num(g.calls_running), num(g.calls_done), num(g.calls_failed),
            (num(g.waited_ms) / 1000).toFixed(1) + " s"]}));
  table("graphs", "Graphs in flight", ["graph", "client", "running",
        "done (held)", "failed", "oldest running"], rows, "no graph in flight");
}

function drawTenants(st) {
  const by = new Map();
  let total = 0;
  for (const c of st.clients || []) {
    const t = by.get(c.tenant) || {clients: 0, pending: 0, inFlight: 0, micros: 0, weight: 0};
    t.clients++; t.pending += num(c.calls_pending); t.inFlight += num(c.calls_in_flight);
    t.micros += num(c.device_micros); t.weight += num(c.weight || 1);
    by.set(c.tenant, t);
    total += num(c.device_micros);
  }
  const rows = [...by.entries()].map(([name, t]) => ({
    cells: [name, t.clients, t.weight, t.pending, t.inFlight, seconds(t.micros),
            total ? (100 * t.micros / total).toFixed(1) + "%" : "–"]}));
  table("tenants", "Tenants (admission)", ["tenant", "clients", "weight",
        "pending", "in flight", "device time", "share"], rows, "no tenants");
}

function drawRecovery(st, now) {
  const r = st.recovery || {};
  const keys = ["hosts_lost", "slices_remapped", "slices_broken",
                "calls_recomputed", "buffers_restored", "buffers_failed",
                "snapshots_taken", "shards_from_snapshots", "losses_awaited",
                "losses_resumed", "call_records", "buffer_records"];
  const counters = document.getElementById("recovery");
  counters.replaceChildren(...keys.map((k) => el("span", {class: num(r[k]) ? "chip set" : "chip"},
                                                  k.replace(/_/g, " ") + " ", el("b", {}, num(r[k])))));
  const events = document.getElementById("events");
  const stamp = new Date(now).toLocaleTimeString();
  if (lastRecovery) {
    for (const k of keys.slice(0, 10)) {
      if (num(r[k]) !== num(lastRecovery[k])) {
        events.prepend(el("li", {}, stamp + "  " + k.replace(/_/g, " ") + ": " +
                          num(lastRecovery[k]) + " → " + num(r[k])));
      }
    }
  }
  for (const w of st.workers || []) {
    const was = lastWorkers.get(w.worker_id);
    if (was !== undefined && was && !w.alive) {
      events.prepend(el("li", {class: "bad"}, stamp + "  " + w.host_name +
                        " (worker " + w.worker_id + ") down: " + (w.down_reason || "?")));
    } else if (was === undefined && lastRecovery) {
      events.prepend(el("li", {}, stamp + "  " + w.host_name + " (worker " +
                        w.worker_id + ") registered" + (w.spare ? " as a spare" : "")));
    }
    lastWorkers.set(w.worker_id, w.alive);
  }
  while (events.children.length > 100) events.lastChild.remove();
  lastRecovery = r;
}

// ------------------------------------------------------------------ polling

async function poll() {
  let reply;
  try {
    reply = await fetch("/api/status", {headers: {Authorization: "Bearer " + token}});
  } catch (e) {
    document.getElementById("updated").textContent = "server unreachable: " + e;
    document.getElementById("updated").className = "bad";
    return;
  }
  if (reply.status === 401 || reply.status === 403) {
    sessionStorage.removeItem("plexus-token");
    token = null;
    showLogin(await reply.text());
    return;
  }
  if (!reply.ok) {
    document.getElementById("updated").textContent = "error " + reply.status;
    return;
  }
  const data = await reply.json();
  const st = data.status, now = Number(data.now_ms);
  document.getElementById("address").textContent = st.address || "";
  document.getElementById("viewer").textContent = "as " + data.viewer;
  const updated = document.getElementById("updated");
  updated.textContent = "updated " + new Date(now).toLocaleTimeString();
  updated.className = "muted";
  const workers = new Map((st.workers || []).map((w) => [w.worker_id, w]));
  drawWhy(st);
  drawHosts(st, data.history, now);
  drawClients(st);
  drawTenants(st);
  drawGraphs(st);
  drawRecovery(st, now);
  drawCharts(data.history, now, workers);
  document.body.dataset.updates = String(++updates);
}

function showLogin(message) {
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
}

function start() {
  document.getElementById("login").hidden = true;
  document.getElementById("main").hidden = false;
  charts = {
    busy: charts.busy || lineChart("busy-chart", "Device busy", "%", 100),
    memory: charts.memory || lineChart("memory-chart", "Device memory live", "bytes",
                                       undefined, (v) => human(v)),
    calls: charts.calls || lineChart("calls-chart", "Calls", "per second / count"),
    transfers: charts.transfers || lineChart("transfers-chart", "Transfers by path",
                                             "bytes / s", undefined,
                                             (v) => human(v) + "/s"),
  };
  const loop = async () => { await poll(); if (token) setTimeout(loop, POLL_MS); };
  loop();
}

document.getElementById("login").addEventListener("submit", (e) => {
  e.preventDefault();
  token = document.getElementById("token").value.trim();
  sessionStorage.setItem("plexus-token", token);
  start();
});

token = readToken();
if (token) start(); else showLogin("");
