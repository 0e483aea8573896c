// spanflow dashboard: one page, hash routes, live data from the coordinator's
// server-sent event stream (/api/v1/stream). No build step, no CDN: the libraries
// (uPlot, cytoscape) are vendored under vendor/.
"use strict";

const TOKEN_KEY = "spanflow.token";
const KEEP_SAMPLES = 300;
const COLOURS = ["#2f6fde", "#d64545", "#1f9d55", "#d98c00", "#7b4fd6", "#0f9bb0", "#b0479a", "#5a6b7d"];

const S = {
  snap: null,          // the last Snapshot
  topology: null,      // sites and links
  log: [],             // control-log entries, oldest first
  lastSeq: 0,
  data: [],            // feed events (anomalies, pattern matches, alerts), oldest first
  lastEvent: 0,
  incidents: new Map(), // incident id -> Incident (feed events grouped per key)
  series: {},          // fragment id -> [FragmentSample], oldest first
  connected: false,
  page: null,
  charts: [],          // uPlot instances of the current page
  graph: null,         // cytoscape instance of the current page
  graphKey: "",
  specs: {},           // pipeline name -> spec
  plans: {},           // pipeline name -> its fragments with their own steps (the planner's cut)
};

// -- helpers -----------------------------------------------------------------------
const $ = (sel, root = document) => root.querySelector(sel);
function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function num(v, digits = 0) {
  if (v === null || v === undefined) return "–";
  return Number(v).toLocaleString("en-US", {maximumFractionDigits: digits, minimumFractionDigits: 0});
}
function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  return seconds < 1 ? "just now" : `${num(seconds, 1)} s ago`;
}
// 24-hour time of day in the browser's locale (chart axes: no dates, no am/pm)
function hhmmss(unix) {
  return new Date(unix * 1000).toLocaleTimeString(undefined, {hour12: false, hour: "2-digit", minute: "2-digit", second: "2-digit"});
}
function clock(unix) {
  return new Date(unix * 1000).toLocaleTimeString("en-GB", {hour12: false});
}
function stateTag(s) { return `<span class="state ${esc(s)}">${esc(s)}</span>`; }
// Numbers to three significant digits; ISO times to the browser's clock.
const SIG3 = new Intl.NumberFormat(undefined, {maximumSignificantDigits: 3});
function readable(v) {
  if (typeof v === "number") return SIG3.format(v);
  if (typeof v === "string" && /^\d{4}-\d\d-\d\dT\d\d:\d\d/.test(v)) {
    const t = Date.parse(v);
    if (!Number.isNaN(t)) return new Date(t).toLocaleTimeString(undefined, {hour12: false});
  }
  return v !== null && typeof v === "object" ? JSON.stringify(v) : String(v);
}
// A record as people read it: no nulls, no internal fields, readable values.
function readableFields(obj) {
  return Object.entries(obj || {}).filter(([k, v]) => v !== null && v !== "" && !k.startsWith("_"))
    .map(([k, v]) => `${k} ${readable(v)}`).join(" · ");
}
function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function headers(extra = {}) {
  const t = token();
  return t ? {...extra, Authorization: `Bearer ${t}`} : extra;
}

class ApiError extends Error {
  constructor(status, detail) { super(`${status}: ${detail}`); this.status = status; this.detail = detail; }
}

async function api(path, {method = "GET", body} = {}) {
  const init = {method, headers: headers(body !== undefined ? {"Content-Type": "application/json"} : {})};
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(path, init);
  if (!r.ok) {
    let detail = r.statusText;
    try { const j = await r.json(); detail = typeof j.detail === "string" ? j.detail : JSON.stringify(j.detail); } catch (_) { /* not JSON */ }
    throw new ApiError(r.status, detail);
  }
  return r.status === 204 ? null : r.json();
}

function banner(text) {
  const b = $("#banner");
  b.hidden = !text;
  b.textContent = text || "";
}

// -- live stream ---------------------------------------------------------------------
function remember(samples) {
  for (const [fid, s] of Object.entries(samples || {})) {
    const list = S.series[fid] || (S.series[fid] = []);
    if (!list.length || list[list.length - 1].at < s.at) list.push(s);
    if (list.length > KEEP_SAMPLES) list.splice(0, list.length - KEEP_SAMPLES);
  }
}

function onSnapshot(snap) {
  S.snap = snap;
  remember(snap.samples);
  const leader = snap.cluster.leader ? `leader ${snap.cluster.leader} · epoch ${snap.cluster.leader_epoch}` : "no leader";
  setLive(true, leader);
  drawHealth(snap.concerns || []);
  refresh();
}

// The health strip on every page: green, or the worst level with each concern's reason.
function drawHealth(concerns) {
  const el = $("#health");
  if (!el) return;
  const level = concerns.length ? concerns[0].level : "green";
  el.dataset.level = level;
  el.innerHTML = concerns.length
    ? concerns.slice(0, 6).map((c) => `<span class="concern ${esc(c.level)}" data-concern="${esc(c.level)}"><b>${esc(c.what)}</b> ${esc(c.reason)}</span>`).join("")
      + (concerns.length > 6 ? `<span class="muted">and ${concerns.length - 6} more</span>` : "")
    : `<span class="concern green">all well: every node heard, every pipeline running and keeping up</span>`;
}

function onLog(entry) {
  if (entry.seq <= S.lastSeq) return;
  S.log.push(entry);
  S.lastSeq = entry.seq;
  if (S.log.length > 2000) S.log.splice(0, S.log.length - 2000);
  if (S.page === "events") renderEvents(false);
}

function onIncident(i) {
  S.incidents.set(i.id, i);
  if (S.incidents.size > 300) S.incidents.delete(S.incidents.keys().next().value);
  if (S.page === "events") renderDetections();
}

function onData(e) {
  if (e.seq <= S.lastEvent) return;
  S.data.push(e);
  S.lastEvent = e.seq;
  if (S.data.length > 1000) S.data.splice(0, S.data.length - 1000);
  if (S.page === "events") renderDetections();
}

function setLive(on, text) {
  S.connected = on;
  const el = $("#live");
  el.className = `pill ${on ? "on" : "off"}`;
  el.textContent = on ? `live · ${text}` : text;
}

let streamAbort = null;
async function stream() {
  // fetch, not EventSource: EventSource cannot send the Authorization header.
  while (true) {
    streamAbort = new AbortController();
    try {
      const r = await fetch(`/api/v1/stream?interval=1&after=${S.lastSeq}&after_event=${S.lastEvent}`, {headers: headers(), signal: streamAbort.signal});
      if (r.status === 401) {
        setLive(false, "token needed");
        banner("This cluster needs its bearer token to read: enter it above.");
        await waitForToken();
        continue;
      }
      if (!r.ok) throw new Error(`stream answered ${r.status}`);
      banner("");
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      while (true) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true});
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const raw = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const kind = (raw.match(/^event: (.*)$/m) || [])[1];
          const data = (raw.match(/^data: (.*)$/m) || [])[1];
          if (!data) continue;
          if (kind === "snapshot") onSnapshot(JSON.parse(data));
          else if (kind === "log") onLog(JSON.parse(data));
          else if (kind === "data") onData(JSON.parse(data));
          else if (kind === "incident") onIncident(JSON.parse(data));
        }
      }
    } catch (err) {
      if (err.name === "AbortError") continue;  // restarted (a new token)
    }
    setLive(false, "reconnecting…");
    await new Promise((ok) => setTimeout(ok, 2000));
  }
}

let tokenWaiters = [];
function waitForToken() { return new Promise((ok) => tokenWaiters.push(ok)); }

// -- routing -------------------------------------------------------------------------
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [page, ...rest] = hash.split("/");
  return {page: page || "network", arg: rest.map(decodeURIComponent).join("/") || null};
}

function teardown() {
  for (const c of S.charts) c.destroy();
  S.charts = [];
  if (S.graph) { S.graph.destroy(); S.graph = null; S.graphKey = ""; }
}

async function show() {
  const {page, arg} = route();
  teardown();
  S.page = page;
  S.arg = arg;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.page === page);
  const main = $("#page");
  main.dataset.page = page;
  main.innerHTML = "";
  if (page === "network") await renderNetwork(true);
  else if (page === "pipelines" && arg) await renderPipeline(arg, true);
  else if (page === "pipelines") renderPipelines();
  else if (page === "events") await renderEvents(true);
  else if (page === "models") await renderModels();
  else if (page === "api") main.innerHTML = `<h1>REST API</h1><p class="muted">The coordinator's OpenAPI reference (<a href="/openapi.json">openapi.json</a>). With a token set, use “Authorize”.</p><iframe class="docs" src="/docs" title="REST API reference"></iframe>`;
  else main.innerHTML = `<h1>Not found</h1><p><a href="#/">Back to the network</a></p>`;
}

function refresh() {
  if (!S.snap) return;
  if (S.page === "network") renderNetwork(false);
  else if (S.page === "pipelines" && S.arg) renderPipeline(S.arg, false);
  else if (S.page === "pipelines") renderPipelines();
  else if (S.page === "models") redrawFailed();
}

// A models or rules panel that could not be read (the API busy or unreachable a
// moment) is read again at the next snapshot rather than left showing the error.
function redrawFailed() {
  if (document.querySelector("#models > .result.error")) drawModels();
  if (document.querySelector("#rules > .result.error")) drawRules();
}

// -- network page --------------------------------------------------------------------
async function renderNetwork(first) {
  const main = $("#page");
  if (first) {
    main.innerHTML = `<h1>Network</h1><div id="cards" class="cards"></div>
      <h2>Sites, nodes and links</h2><div id="graph"></div>
      <h2>Nodes</h2><div id="nodes"></div>`;
    try { S.topology = await api("/api/v1/topology"); } catch (_) { S.topology = null; }
  }
  const snap = S.snap;
  if (!snap) { $("#cards").innerHTML = `<p class="muted">waiting for the first update…</p>`; return; }
  const c = snap.cluster;
  const running = c.pipelines.running || 0;
  const cards = [
    ["nodes alive", c.nodes.alive || 0, "nodes-alive"],
    ["nodes failed", c.nodes.failed || 0, "nodes-failed"],
    ["slots used", `${c.slots_used} / ${c.slots}`, "slots"],
    ["rows/s in", num(c.throughput_rows_per_s, 1), "throughput"],
    ["CPU", `${num(c.cpu_percent, 1)} %`, "cpu"],
    ["pipelines running", running, "pipelines-running"],
    ["pipelines degraded", snap.pipelines.filter((p) => p.health === "degraded").length, "pipelines-degraded"],
    ["leader", c.leader || "none", "leader"],
    ["epoch", c.leader_epoch, "epoch"],
  ];
  $("#cards").innerHTML = cards.map(([k, v, id]) => `<div class="card" data-card="${id}"><div class="v">${esc(v)}</div><div class="k">${esc(k)}</div></div>`).join("");
  $("#nodes").innerHTML = nodeTable(snap.nodes);
  drawNetwork(snap.nodes);
}

function nodeTable(nodes) {
  const rows = nodes.map((n) => {
    const peers = Object.entries(n.gossip || {});
    const gossip = peers.length ? peers.map(([p, v]) => `${esc(p)}: ${stateTag(v.state)}`).join(", ") : `<span class="muted">–</span>`;
    const silent = ["dead", "suspect", "declared"].includes(n.health);  // its last figures are not now's
    return `<tr data-node="${esc(n.name)}"${silent ? ` class="stale"` : ""}>
      <td><b>${esc(n.name)}</b><div class="muted">${esc(n.host || "")}</div></td>
      <td>${esc(n.spec.site)}</td>
      <td data-field="health">${stateTag(n.health)}</td>
      <td class="num" data-field="load">${n.load === null || silent ? "–" : num(n.load, 2)}</td>
      <td class="num" data-field="cpu">${n.cpu_percent === null || silent ? "–" : num(n.cpu_percent, 0) + " %"}</td>
      <td class="num" data-field="slots">${n.slots_used} / ${n.slots}</td>
      <td data-field="fragments" class="mono">${n.fragments.map(esc).join("<br>") || "–"}</td>
      <td>${ago(n.last_heartbeat_s)}</td>
      <td class="detail">${gossip}</td>
      <td>${n.warnings.map(esc).join("<br>")}</td>
    </tr>`;
  }).join("");
  return `<table id="node-table"><thead><tr><th>node</th><th>site</th><th>health</th><th class="num">load</th>
    <th class="num">CPU</th><th class="num">slots used</th><th>fragments</th><th>heard</th><th>gossip view</th><th>warnings</th></tr></thead>
    <tbody>${rows || `<tr><td colspan="10" class="muted">no nodes registered</td></tr>`}</tbody></table>`;
}

const HEALTH_COLOUR = {alive: "#1f9d55", suspect: "#d98c00", "last-known": "#d98c00", draining: "#d98c00", dead: "#d64545", fenced: "#d64545", declared: "#8a94a3"};

function drawNetwork(nodes) {
  const box = $("#graph");
  if (!box || typeof cytoscape === "undefined") return;
  const sites = new Set(nodes.map((n) => n.spec.site));
  const topo = S.topology || {sites: [], links: []};
  for (const s of topo.sites || []) sites.add(s.name);
  const links = (topo.links || []).filter((l) => l.between && l.between.length === 2);
  const key = [...sites].sort().join(",") + "|" + nodes.map((n) => n.name).join(",") + "|" + links.length;
  const data = (n) => ({id: `node:${n.name}`, label: `${n.name}\n${n.health} · ${n.slots_used}/${n.slots}`, colour: HEALTH_COLOUR[n.health] || "#8a94a3"});
  // A site none of whose nodes can be reached is drawn red, not as a healthy box.
  const siteData = (s) => {
    const members = nodes.filter((n) => n.spec.site === s);
    const lost = members.length > 0 && members.every((n) => ["dead", "suspect", "declared"].includes(n.health));
    return {id: `site:${s}`, label: s, fill: lost ? "#f6d5d5" : "#e3eaf4", border: lost ? "#d64545" : "#8ea2bb"};
  };
  if (S.graph && S.graphKey === key) {
    for (const n of nodes) S.graph.getElementById(`node:${n.name}`).data(data(n));
    for (const s of sites) S.graph.getElementById(`site:${s}`).data(siteData(s));
    return;
  }
  if (S.graph) S.graph.destroy();
  const elements = [];
  for (const s of sites) elements.push({data: siteData(s), classes: "site"});
  for (const n of nodes) {
    elements.push({data: data(n), classes: "node"});
    elements.push({data: {id: `in:${n.name}`, source: `site:${n.spec.site}`, target: `node:${n.name}`}, classes: "member"});
  }
  links.forEach((l, i) => {
    const [a, b] = l.between;
    const lat = typeof l.latency === "number" ? `${Math.round(l.latency * 1000)} ms` : String(l.latency ?? "");
    if (sites.has(a) && sites.has(b)) elements.push({data: {id: `link:${i}`, source: `site:${a}`, target: `site:${b}`, label: lat}, classes: "link"});
  });
  S.graph = cytoscape({
    container: box, elements, maxZoom: 1.4, minZoom: 0.3,
    style: [
      {selector: "node.site", style: {label: "data(label)", shape: "round-rectangle", "text-valign": "center", "font-weight": 600, "font-size": 12, "background-color": "data(fill)", "border-color": "data(border)", "border-width": 1, width: (e) => e.data("label").length * 7.5 + 16, height: 28}},
      {selector: "node.node", style: {label: "data(label)", "text-wrap": "wrap", "text-valign": "bottom", "text-margin-y": 3, "font-size": 10, "background-color": "data(colour)", width: 22, height: 22}},
      {selector: "edge.link", style: {label: "data(label)", "font-size": 10, "line-color": "#5f86c6", width: 3, "curve-style": "bezier", "text-background-color": "#fff", "text-background-opacity": 1}},
      {selector: "edge.member", style: {"line-color": "#c3ccd8", width: 1, "line-style": "dashed"}},
    ],
    layout: {name: "cose", animate: false, padding: 30, nodeRepulsion: 12000, idealEdgeLength: 90, randomize: false},
  });
  S.graphKey = key;
}

// -- pipelines -----------------------------------------------------------------------
// The pipeline's own input, each record once, from the fragments that can be reached.
function pipelineRate(p) { return p.input_rows_per_s; }

// A running pipeline with a fragment that does not run (or cannot be reached) is degraded.
function pipelineState(p) { return p.health === "degraded" ? "degraded" : p.state; }

// Sites declared or removed since the pipeline was placed, that its plan does not follow.
function sitesBehind(p) {
  const b = p.sites_behind;
  if (!b) return "";
  const parts = [];
  if (b.joined.length) parts.push(`joined, not read: ${b.joined.map(esc).join(", ")}`);
  const draining = b.draining || [];
  const held = b.left.filter((s) => !draining.includes(s));
  if (draining.length) parts.push(`left, draining: ${draining.map(esc).join(", ")}`);
  if (held.length) parts.push(`left, still planned: ${held.map(esc).join(", ")}`);
  return `<div class="state degraded" data-field="sites-behind">sites ${parts.join("; ")}</div>`;
}

function renderPipelines() {
  const main = $("#page");
  const ps = S.snap ? S.snap.pipelines : [];
  const rows = ps.map((p) => `<tr data-pipeline="${esc(p.name)}">
      <td><a href="#/pipelines/${encodeURIComponent(p.name)}"><b>${esc(p.name)}</b></a></td>
      <td><span data-field="state">${stateTag(pipelineState(p))}</span><div class="muted">${esc(p.reason)}</div>${sitesBehind(p)}</td>
      <td class="num">${p.priority}</td>
      <td class="num">${p.latency_budget === null ? "–" : num(p.latency_budget, 2) + " s"}</td>
      <td class="num">${p.latency_estimate_s === null ? "–" : num(p.latency_estimate_s, 2) + " s"}${p.over_latency_budget ? ` <span class="state failed">over</span>` : ""}</td>
      <td class="num" data-field="fragments">${p.fragments.filter((f) => f.node).length} / ${p.fragments.length}</td>
      <td class="num">${num(pipelineRate(p), 1)}</td>
    </tr>`).join("");
  main.innerHTML = `<h1>Pipelines</h1>
    <table id="pipeline-table"><thead><tr><th>pipeline</th><th>state</th><th class="num">priority</th><th class="num">budget</th>
    <th class="num">latency estimate</th><th class="num">fragments placed</th><th class="num">rows/s in</th></tr></thead>
    <tbody>${rows || `<tr><td colspan="7" class="muted">${S.snap ? "no pipelines submitted" : "waiting for the first update…"}</td></tr>`}</tbody></table>`;
}

const CHARTS = [
  ["input rows/s", "input_rows_per_s"],
  ["processed rows/s", "processed_rows_per_s"],
  ["batch duration (ms)", "last_batch_ms"],
  ["end-to-end latency p50 (s)", "latency_p50_s"],
  ["end-to-end latency p99 (s)", "latency_p99_s"],
  ["backlog (messages behind)", "lag"],
  ["state (rows)", "state_rows"],
  ["dead letters (total)", "dead_letters"],
  ["late records (total, of the dead letters)", "late_records"],
  ["restarts (total)", "restarts"],
];

async function renderPipeline(name, first) {
  const main = $("#page");
  const p = S.snap && S.snap.pipelines.find((x) => x.name === name);
  if (first) {
    main.innerHTML = `<p><a href="#/pipelines">← pipelines</a></p><h1>Pipeline <span class="mono">${esc(name)}</span></h1>
      <div id="pipeline-head"></div>
      <div class="toolbar" id="pipeline-actions">
        <button data-action="savepoint">Savepoint</button><button data-action="resume">Resume</button>
        <button data-action="cancel" class="danger">Cancel</button></div>
      <div id="action-result"></div>
      <h2>Steps and where they run</h2><div id="dag"></div>
      <h2>Fragments</h2><div id="fragments"></div>
      <h2>Queries: checkpoints, state and errors</h2><div id="queries"></div>
      <h2>Live figures</h2><div class="charts" id="charts"></div>
      <h2>Lifecycle</h2><div id="history"></div>`;
    for (const b of main.querySelectorAll("#pipeline-actions button")) {
      b.onclick = () => {
        // Cancel ends the run (its state is gone): ask first
        if (b.dataset.action === "cancel" && !confirm(`Cancel ${name}? It stops for good; its state is not kept (take a savepoint to keep it).`)) return;
        act(`/api/v1/pipelines/${encodeURIComponent(name)}/${b.dataset.action}`, `${b.dataset.action} ${name}`);
      };
    }
    try {
      const [spec, history, plan] = await Promise.all([
        S.specs[name] ? Promise.resolve(S.specs[name]) : api(`/api/v1/pipelines/${encodeURIComponent(name)}/spec`),
        api(`/api/v1/pipelines/${encodeURIComponent(name)}/history`),
        api(`/api/v1/pipelines/${encodeURIComponent(name)}/plan`).catch(() => null),
      ]);
      S.specs[name] = spec;
      S.plans[name] = plan;
      for (const [fid, samples] of Object.entries(history.fragments)) {
        const known = S.series[fid] || [];
        const newest = known.length ? known[0].at : Infinity;
        S.series[fid] = samples.filter((s) => s.at < newest).concat(known).slice(-KEEP_SAMPLES);
      }
    } catch (err) {
      $("#pipeline-head").innerHTML = `<div class="result error">${esc(err.message)}</div>`;
      return;
    }
  }
  if (!p) { $("#pipeline-head").innerHTML = `<p class="muted">${S.snap ? "no such pipeline" : "waiting for the first update…"}</p>`; return; }
  $("#pipeline-head").innerHTML = `<div class="cards">
    <div class="card" data-card="state"><div class="v">${stateTag(pipelineState(p))}</div><div class="k">${esc(p.reason) || "state"}</div></div>
    <div class="card"><div class="v">${p.priority}</div><div class="k">priority</div></div>
    <div class="card"><div class="v">${p.latency_budget === null ? "–" : num(p.latency_budget, 2) + " s"}</div><div class="k">latency budget</div></div>
    <div class="card"><div class="v">${p.latency_estimate_s === null ? "–" : num(p.latency_estimate_s, 2) + " s"}</div><div class="k">latency estimate</div></div>
    <div class="card"><div class="v">${p.parallelism}</div><div class="k">parallelism</div></div>
    <div class="card"><div class="v">${num(pipelineRate(p), 1)}</div><div class="k">rows/s in</div></div></div>`;
  $("#fragments").innerHTML = fragmentTable(p);
  $("#queries").innerHTML = queryTable(p);
  $("#history").innerHTML = `<table><thead><tr><th>at</th><th>state</th><th>reason</th></tr></thead><tbody>${
    p.history.slice().reverse().map((h) => `<tr><td>${clock(h.at)}</td><td>${stateTag(h.state)}</td><td>${esc(h.reason)}</td></tr>`).join("")}</tbody></table>`;
  drawDag(p);
  drawCharts(p, first);
}

// Upper bounds of every histogram spanflow reports (spanflow.protocol.metrics.LATENCY_BUCKETS)
const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
// The q quantile of a histogram's counts, interpolated in its bucket (as Prometheus does)
function quantile(q, counts) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (!total) return null;
  let below = 0;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] && below + counts[i] >= q * total) {
      if (i === BUCKETS.length) return BUCKETS[BUCKETS.length - 1];
      const lower = i ? BUCKETS[i - 1] : 0;
      return lower + (BUCKETS[i] - lower) * (q * total - below) / counts[i];
    }
    below += counts[i];
  }
  return BUCKETS[BUCKETS.length - 1];
}
function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "kB", "MB", "GB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(n) / 3));
  return `${SIG3.format(n / 1000 ** i)} ${units[i]}`;
}

// Per query (one per sink of a fragment): what it read and wrote, how its batches and
// checkpoints take, its state, and the fragment's last error with its restarts.
function queryTable(p) {
  const rows = [];
  for (const f of p.fragments) {
    const rt = f.runtime;
    if (!rt) continue;
    for (const [query, m] of Object.entries(rt.metrics || {})) {
      const ratio = m.trigger_seconds > 0 && !m.realtime ? m.last_batch_seconds / m.trigger_seconds : null;
      const p50 = quantile(0.5, m.checkpoint_seconds.counts), p99 = quantile(0.99, m.checkpoint_seconds.counts);
      rows.push(`<tr data-query="${esc(f.id)}/${esc(query)}"${f.status === "unreachable" ? ` class="stale"` : ""}>
        <td class="mono">${esc(shortId(f.id, p.name))}</td><td class="mono">${esc(query)}</td><td>${m.realtime ? "real time" : "micro-batch"}</td>
        <td class="num">${num(m.records_in)}</td><td class="num">${m.records_out === null ? "–" : num(m.records_out)}</td><td class="num">${num(m.batches)}</td>
        <td class="num" data-field="pressure">${ratio === null ? "–" : `<span class="${ratio >= 1 ? "state failing" : ""}">${SIG3.format(m.last_batch_seconds)} s / ${SIG3.format(m.trigger_seconds)} s</span>`}</td>
        <td class="num" data-field="checkpoint">${p50 === null ? "–" : `${SIG3.format(p50 * 1000)} / ${SIG3.format(p99 * 1000)} ms`}</td>
        <td class="num">${num(m.state_rows)}</td><td class="num">${bytes(m.state_bytes)}</td></tr>`);
    }
    if (rt.error || rt.restarts) {
      const lines = String(rt.error || "").split("\n").slice(0, 3).join("\n");
      rows.push(`<tr class="error-row" data-errors="${esc(f.id)}"><td class="mono">${esc(shortId(f.id, p.name))}</td>
        <td colspan="9"><b>${num(rt.restarts)} restarts</b>${lines ? `<pre class="error">${esc(lines)}</pre>` : ""}</td></tr>`);
    }
  }
  return rows.length ? `<table id="query-table"><thead><tr><th>fragment</th><th>query (sink)</th><th>mode</th>
    <th class="num">records in</th><th class="num">records out</th><th class="num">batches</th><th class="num">last batch / trigger</th>
    <th class="num">checkpoint p50 / p99</th><th class="num">state rows</th><th class="num">state size</th></tr></thead><tbody>${rows.join("")}</tbody></table>`
    : `<p class="muted">no query has reported yet</p>`;
}

function fragmentTable(p) {
  const rows = p.fragments.map((f) => {
    const rt = f.runtime || {};
    const stale = f.status === "unreachable";
    const heard = stale && f.stale_s !== null ? `<div class="muted" data-field="stale">last heard ${num(f.stale_s, 0)} s ago</div>` : "";
    return `<tr data-fragment="${esc(f.id)}"${stale ? ` class="stale" title="its node cannot be reached: the figures are its last report"` : ""}>
      <td class="mono">${esc(f.id)}</td><td>${esc(f.kind)}</td><td>${esc(f.site || "–")}</td>
      <td data-field="node">${esc(f.node || "–")}</td><td><span data-field="status">${stateTag(f.status)}</span>${heard}</td><td class="num">${f.epoch}</td>
      <td class="num" data-field="rows_in">${num(rt.rows_in)}</td><td class="num">${num(rt.input_rows_per_s, 1)}</td>
      <td class="num">${num(rt.last_batch_ms)}</td><td class="num">${num(rt.lag)}</td><td class="num" data-field="dead_letters">${num(rt.dead_letters)}${rt.late_records ? ` (${num(rt.late_records)} late)` : ""}</td>
      <td class="num">${num(rt.restarts)}</td><td class="mono">${esc(f.steps.join(", "))}</td>
    </tr>`;
  }).join("");
  return `<table id="fragment-table"><thead><tr><th>fragment</th><th>kind</th><th>site</th><th>node</th><th>status</th><th class="num">epoch</th>
    <th class="num">rows in</th><th class="num">rows/s</th><th class="num">batch ms</th><th class="num">backlog</th><th class="num">dead letters</th>
    <th class="num">restarts</th><th>steps</th></tr></thead><tbody>${rows}</tbody></table>`;
}

// The job graph as the planner cut it: a box per fragment (edge site or cloud, its node
// and status) holding its own steps — a site's partial aggregate and the reads of
// another fragment's output included — and the streams between fragments.
function drawDag(p) {
  const box = $("#dag");
  const plan = S.plans[p.name];
  if (!box || !plan || typeof cytoscape === "undefined") return;
  const status = Object.fromEntries(p.fragments.map((f) => [f.id, f]));
  const key = p.name + "|" + plan.map((f) => f.id).join(",") + "|" + p.fragments.map((f) => `${f.id}@${f.node}:${f.status}`).join(",");
  if (S.graph && S.graphKey === key) return;
  if (S.graph) S.graph.destroy();
  const elements = [];
  const where = (f) => f.kind === "local" ? `edge · ${f.site}` : "cloud · global";
  for (const f of plan) {
    const st = status[f.id] || {};
    const state = st.status || "unplaced";
    const colour = state === "running" ? "#1f9d55" : ["unreachable", "failing", "failed", "fenced", "unassigned"].includes(state) ? "#d64545" : "#d98c00";
    elements.push({data: {id: `frag:${f.id}`, label: `${shortId(f.id, p.name)} — ${where(f)} on ${st.node || f.node || "no node"} (${state})`, colour}, classes: "fragment"});
    for (const step of f.steps) {
      elements.push({data: {id: `${f.id}/${step.id}`, parent: `frag:${f.id}`, label: `${step.id}\n${step.type}`}, classes: "step"});
      for (const input of step.inputs || []) elements.push({data: {id: `${f.id}/${input}->${step.id}`, source: `${f.id}/${input}`, target: `${f.id}/${step.id}`}});
      if (step.schema_of) {  // reads what another fragment's step wrote: draw the hop
        for (const g of plan) if (g !== f && g.steps.some((x) => x.id === step.schema_of)) {
          elements.push({data: {id: `${g.id}/${step.schema_of}=>${f.id}/${step.id}`, source: `${g.id}/${step.schema_of}`, target: `${f.id}/${step.id}`}, classes: "hop"});
        }
      }
    }
  }
  S.graph = cytoscape({
    container: box, elements,
    style: [
      {selector: "node.step", style: {label: "data(label)", "text-wrap": "wrap", "font-size": 11, "text-valign": "bottom", "text-margin-y": 2, "background-color": "#5a6b7d", width: 14, height: 14}},
      {selector: "node.fragment", style: {label: "data(label)", "font-size": 11, "font-weight": 600, "text-valign": "top", "text-halign": "center", "background-color": "#f3f6fa", "border-color": "data(colour)", "border-width": 2, shape: "round-rectangle", padding: 18}},
      {selector: "edge", style: {"curve-style": "bezier", "target-arrow-shape": "triangle", "line-color": "#9fb0c4", "target-arrow-color": "#9fb0c4", width: 1.5}},
      {selector: "edge.hop", style: {"line-style": "dashed", "line-color": "#5f86c6", "target-arrow-color": "#5f86c6", width: 2}},
    ],
    maxZoom: 1.3,
    // breadth-first, turned to run left to right: the page is wider than it is tall
    layout: {name: "breadthfirst", directed: true, padding: 20, spacingFactor: 0.9, nodeDimensionsIncludeLabels: true, avoidOverlap: true,
      transform: (node, pos) => ({x: pos.y * 1.6, y: pos.x * 0.7})},
  });
  S.graphKey = key;
}

function shortId(fragment, pipeline) {
  return fragment.startsWith(pipeline + ".") ? fragment.slice(pipeline.length + 1) : fragment;
}

function drawCharts(p, first) {
  const box = $("#charts");
  if (!box || typeof uPlot === "undefined") return;
  const ids = p.fragments.map((f) => f.id);
  const times = [...new Set(ids.flatMap((id) => (S.series[id] || []).map((s) => s.at)))].sort((a, b) => a - b);
  const index = ids.map((id) => new Map((S.series[id] || []).map((s) => [s.at, s])));
  const dataFor = (field) => [times, ...index.map((m) => times.map((t) => (m.has(t) ? m.get(t)[field] : null)))];
  if (first || S.charts.length !== CHARTS.length || S.chartIds !== ids.join(",")) {
    for (const c of S.charts) c.destroy();
    S.charts = [];
    S.chartIds = ids.join(",");
    box.innerHTML = "";
    for (const [title, field] of CHARTS) {
      const holder = document.createElement("div");
      holder.className = "chart";
      holder.dataset.chart = field;
      holder.innerHTML = `<h3>${esc(title)}</h3>`;
      box.appendChild(holder);
      const width = Math.max(380, holder.clientWidth - 10);
      S.charts.push(new uPlot({
        width, height: 200, legend: {show: true}, cursor: {drag: {x: false, y: false}},
        scales: {x: {time: true}},
        series: [{}, ...ids.map((id, i) => ({label: shortId(id, p.name), stroke: COLOURS[i % COLOURS.length], width: 1.5, spanGaps: true}))],
        axes: [{values: (u, ticks) => ticks.map(hhmmss)}, {size: 60}],
      }, dataFor(field), holder));
    }
    return;
  }
  CHARTS.forEach(([, field], i) => S.charts[i].setData(dataFor(field)));
}

// -- actions (need the token) ---------------------------------------------------------
async function act(path, what, body) {
  const out = $("#action-result");
  try {
    await api(path, {method: "POST", body});
    out.innerHTML = `<div class="result ok" data-result="ok">${esc(what)}: done</div>`;
    return true;
  } catch (err) {
    const hint = err.status === 401 ? " — enter the bearer token above to act" : "";
    out.innerHTML = `<div class="result error" data-result="error" data-status="${err.status || ""}">${esc(what)}: ${esc(err.message)}${hint}</div>`;
    return false;
  }
}

// -- events ----------------------------------------------------------------------------
async function renderEvents(first) {
  const main = $("#page");
  if (first) {
    main.innerHTML = `<h1>Events</h1>
      <h2>Detections</h2>
      <p class="muted">Anomalies, pattern matches and alerts as pipelines write them (sinks after a detector or a pattern step, or marked <code>feed:</code>), one row per incident: the records of one key that keep coming (under a minute apart), an anomaly episode from its start to its end. Newest first.</p>
      <div class="toolbar"><label>kind <select id="data-kind"><option value="">all</option><option>anomaly</option><option>pattern</option><option>alert</option></select></label>
      <label>contains <input id="data-filter" placeholder="device, site, pipeline…"></label><span id="data-count" class="muted"></span></div>
      <div id="action-result"></div><div id="detections"></div>
      <h2>Control decisions</h2>
      <p class="muted">Every decision of the control plane, newest first, as it is taken: registrations, placements, moves, sheds, executor scaling, failures, elections.</p>
      <div class="toolbar"><label>kind <select id="kind"><option value="">all</option></select></label>
      <label>contains <input id="filter" placeholder="node, fragment, reason…"></label>
      <span id="event-count" class="muted"></span></div><div id="events"></div>`;
    $("#kind").onchange = () => renderEvents(false);
    $("#filter").oninput = () => renderEvents(false);
    $("#data-kind").onchange = () => renderDetections();
    $("#data-filter").oninput = () => renderDetections();
    $("#detections").onclick = (ev) => rebaseline(ev.target.closest("button[data-rebaseline]"));
    try {
      if (!S.log.length) for (const e of await api("/api/v1/cluster/log?limit=500")) onLog(e);
      if (!S.data.length) for (const e of await api("/api/v1/events?limit=500")) onData(e);
      for (const i of (await api("/api/v1/incidents?limit=300")).reverse()) S.incidents.set(i.id, i);
    } catch (err) {
      $("#events").innerHTML = `<div class="result error">${esc(err.message)}</div>`;
      return;
    }
    renderDetections();
  }
  const kinds = [...new Set(S.log.map((e) => e.kind))].sort();
  const select = $("#kind");
  if (!select) return;
  const chosen = select.value;
  select.innerHTML = `<option value="">all</option>` + kinds.map((k) => `<option ${k === chosen ? "selected" : ""}>${esc(k)}</option>`).join("");
  const text = $("#filter").value.toLowerCase();
  const shown = S.log.filter((e) => (!chosen || e.kind === chosen) && (!text || JSON.stringify(e.detail).toLowerCase().includes(text))).slice(-300).reverse();
  $("#event-count").textContent = `${shown.length} of ${S.log.length}`;
  $("#events").innerHTML = `<table id="event-table"><thead><tr><th class="num">seq</th><th>at</th><th>kind</th><th class="num">epoch</th><th>detail</th></tr></thead><tbody>${
    shown.map((e) => `<tr data-seq="${e.seq}" data-kind="${esc(e.kind)}"><td class="num">${e.seq}</td><td>${clock(e.at)}</td><td><b>${esc(e.kind)}</b></td><td class="num">${e.epoch}</td>
      <td class="detail mono">${esc(fields(e.detail))}</td></tr>`).join("")}</tbody></table>`;
}

function fields(obj) {
  return Object.entries(obj).map(([k, v]) => `${k}=${v !== null && typeof v === "object" ? JSON.stringify(v) : v}`).join("  ");
}

function incidentGoing(i) {
  return !i.ended && (i.episode_open || Date.now() / 1000 - i.last_at <= i.quiet_s);
}

function renderDetections() {
  const box = $("#detections");
  if (!box) return;
  const kind = $("#data-kind").value;
  const text = $("#data-filter").value.toLowerCase();
  const all = [...S.incidents.values()].sort((a, b) => b.last_event - a.last_event);
  const shown = all.filter((i) => (!kind || i.kind === kind) && (!text || (i.pipeline + " " + i.subject + " " + JSON.stringify(i.latest)).toLowerCase().includes(text))).slice(0, 300);
  $("#data-count").textContent = `${shown.length} incidents of ${all.length}`;
  const span = (i) => i.started ? `${readable(i.started)}${i.until && i.until !== i.started ? " – " + readable(i.until) : ""}` : "–";
  const arrived = (i) => i.count > 1 ? `${clock(i.first_at)} – ${clock(i.last_at)}` : clock(i.last_at);
  box.innerHTML = shown.length ? `<table id="detection-table"><thead><tr><th>received</th><th>kind</th><th>pipeline</th><th>key</th><th class="num">records</th><th>event time</th><th class="num">peak</th><th></th><th>newest record</th><th></th></tr></thead><tbody>${
    shown.map((i) => `<tr data-incident="${i.id}" data-kind="${esc(i.kind)}">
      <td>${arrived(i)}</td><td>${stateTag(i.kind)}</td>
      <td><a href="#/pipelines/${encodeURIComponent(i.pipeline)}">${esc(i.pipeline)}</a></td>
      <td class="mono">${esc(i.subject)}</td><td class="num" data-field="count">${i.count}</td><td>${esc(span(i))}</td>
      <td class="num">${i.peak === null ? "–" : esc(readable(i.peak)) + (i.peak_field ? ` <span class="muted">${esc(i.peak_field)}</span>` : "")}</td>
      <td>${incidentGoing(i) ? `<span class="state failing">ongoing</span>` : `<span class="muted">over</span>`}</td>
      <td class="detail">${esc(readableFields(i.latest))}</td>
      <td>${i.kind === "anomaly" ? `<button data-rebaseline="${i.id}" title="Accept this key's behaviour as normal: its detector learns it afresh">Rebaseline</button>` : ""}</td></tr>`).join("")}</tbody></table>`
    : `<p class="muted">nothing detected yet</p>`;
}

// An operator accepts the key of an incident as normal (POST .../rebaseline, token needed)
async function rebaseline(button) {
  if (!button) return;
  const i = S.incidents.get(Number(button.dataset.rebaseline));
  if (!i || !confirm(`Accept the current behaviour of this key in ${i.pipeline} as normal? Its detector forgets what it learnt of it.`)) return;
  await act(`/api/v1/pipelines/${encodeURIComponent(i.pipeline)}/rebaseline`, `rebaseline in ${i.pipeline}`, {record: i.latest});
}

// -- models and rule sets --------------------------------------------------------------
async function renderModels() {
  const main = $("#page");
  main.innerHTML = `<h1>Models &amp; rule sets</h1><div id="action-result"></div>
    <h2>Models</h2><div id="models">loading…</div><h2>Rule sets</h2><div id="rules">loading…</div>`;
  await Promise.all([drawModels(), drawRules()]);
}

async function drawModels() {
  let models;
  try { models = await api("/api/v1/models"); } catch (err) { $("#models").innerHTML = `<div class="result error">${esc(err.message)}</div>`; return; }
  if (!models.length) { $("#models").innerHTML = `<p class="muted">no models registered (spanflow model push …)</p>`; return; }
  const compared = await Promise.all(models.map((m) => api(`/api/v1/models/${encodeURIComponent(m.name)}/comparison`).catch(() => null)));
  $("#models").innerHTML = models.map((m, i) => `<div class="panel" data-model="${esc(m.name)}" style="margin-bottom:.7rem">
    <div class="toolbar"><b class="mono">${esc(m.name)}</b><span>in production: <b data-field="production">${m.production === null ? "none" : "v" + m.production}</b></span>
      <button data-rollback="${esc(m.name)}" ${m.history.length ? "" : "disabled"}>Roll back</button></div>
    ${comparison(compared[i])}
    <table><thead><tr><th>version</th><th>stage</th><th>format</th><th>inputs</th><th>created</th><th>note</th><th></th></tr></thead><tbody>${
      m.versions.slice().reverse().map((v) => `<tr data-version="${v.version}"><td>v${v.version}</td><td>${stateTag(v.stage)}</td><td>${esc(v.format)}</td>
        <td class="mono">${esc(Object.keys(v.inputs).join(", "))}</td><td>${clock(v.created)}</td><td>${esc(v.note)}</td>
        <td>${v.stage === "production" ? "" : `<button class="primary" data-promote="${esc(m.name)}" data-version="${v.version}">Promote</button>`}</td></tr>`).join("")}
    </tbody></table></div>`).join("");
  for (const b of document.querySelectorAll("[data-promote]")) {
    b.onclick = async () => { if (await act(`/api/v1/models/${encodeURIComponent(b.dataset.promote)}/promote`, `promote ${b.dataset.promote} v${b.dataset.version}`, {version: Number(b.dataset.version)})) drawModels(); };
  }
  for (const b of document.querySelectorAll("[data-rollback]")) {
    b.onclick = async () => { if (await act(`/api/v1/models/${encodeURIComponent(b.dataset.rollback)}/rollback`, `roll back ${b.dataset.rollback}`)) drawModels(); };
  }
}

function comparison(c) {
  if (!c || !c.records) return `<p class="muted" data-field="comparison">no live predictions seen yet (pipelines with a score step of this model feed this)</p>`;
  const versions = Object.entries(c.versions).map(([v, f]) => `v${esc(v)}: ${num(f.records)} (${f.mean_prediction === null ? "–" : "mean " + num(f.mean_prediction, 3)})`).join(" · ");
  const shadow = c.shadow ? ` · shadow v${c.shadow.versions.join(", v")} agrees with production on <b>${num(100 * c.shadow.agreement, 1)} %</b> of ${num(c.shadow.compared)}${c.shadow.mean_abs_difference === null ? "" : ` (mean |Δ| ${num(c.shadow.mean_abs_difference, 4)})`}` : "";
  return `<p data-field="comparison">live: ${num(c.records)} predictions — ${versions}${shadow}</p>`;
}

async function drawRules() {
  let sets;
  try { sets = await api("/api/v1/rules"); } catch (err) { $("#rules").innerHTML = `<div class="result error">${esc(err.message)}</div>`; return; }
  if (!sets.length) { $("#rules").innerHTML = `<p class="muted">no rule sets pushed (spanflow rules push …)</p>`; return; }
  $("#rules").innerHTML = `<table><thead><tr><th>rule set</th><th>live version</th><th>versions</th><th></th></tr></thead><tbody>${
    sets.map((r) => `<tr data-rules="${esc(r.name)}"><td class="mono">${esc(r.name)}</td><td data-field="live">${r.current === null ? "–" : "v" + r.current}</td>
      <td>${(r.versions || []).map((v) => `v${v.version}${v.note ? " (" + esc(v.note) + ")" : ""}`).join(", ")}</td>
      <td><button data-rules-rollback="${esc(r.name)}" ${r.history.length ? "" : "disabled"}>Roll back</button></td></tr>`).join("")}</tbody></table>`;
  for (const b of document.querySelectorAll("[data-rules-rollback]")) {
    b.onclick = async () => { if (await act(`/api/v1/rules/${encodeURIComponent(b.dataset.rulesRollback)}/rollback`, `roll back rules ${b.dataset.rulesRollback}`)) drawRules(); };
  }
}

// -- start -----------------------------------------------------------------------------
function showTokenState() {
  $("#token-state").textContent = token() ? "token set" : "read-only";
}

$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = $("#token").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value); else sessionStorage.removeItem(TOKEN_KEY);
  $("#token").value = "";
  showTokenState();
  const waiting = tokenWaiters; tokenWaiters = [];
  for (const ok of waiting) ok();
  if (streamAbort) streamAbort.abort();
  show();
});

window.addEventListener("hashchange", show);
showTokenState();
show();
stream();
