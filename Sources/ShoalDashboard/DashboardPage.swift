/// The dashboard's page: one self-contained HTML file (inline CSS, JavaScript and SVG; nothing fetched from elsewhere)
/// that follows `/events` and posts the demo's controls to `/control`.
enum DashboardPage {
    static let html = #"""
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>Shoal dashboard</title>
<style>
:root { --bg:#0f1720; --panel:#17212b; --line:#2a3a4a; --text:#dde6ee; --dim:#8da0b3; --ok:#3fb27f; --warn:#e0a030; --bad:#e05050; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background:var(--bg); color:var(--text); }
header { display:flex; flex-wrap:wrap; gap:18px; align-items:center; padding:12px 18px; border-bottom:1px solid var(--line); }
header h1 { font-size:18px; margin:0; font-weight:600; }
.badge { padding:3px 10px; border-radius:12px; font-weight:600; font-size:13px; }
.badge.ok { background:var(--ok); color:#06150e; } .badge.no { background:var(--warn); color:#201500; }
.metric { color:var(--dim); } .metric b { color:var(--text); font-variant-numeric: tabular-nums; }
#stream { margin-left:auto; color:var(--dim); font-size:12px; }
#controls { display:none; flex-wrap:wrap; gap:8px; align-items:center; padding:10px 18px; border-bottom:1px solid var(--line); background:var(--panel); }
#controls.on { display:flex; }
select, button { background:#22303e; color:var(--text); border:1px solid var(--line); border-radius:6px; padding:5px 10px; font:inherit; }
button { cursor:pointer; } button:hover { border-color:var(--dim); }
#message { color:var(--dim); margin-left:8px; }
main { display:grid; grid-template-columns: minmax(300px, 420px) 1fr; gap:16px; padding:16px 18px; }
section { background:var(--panel); border:1px solid var(--line); border-radius:10px; padding:12px; }
section h2 { font-size:13px; text-transform:uppercase; letter-spacing:.06em; color:var(--dim); margin:0 0 8px; font-weight:600; }
#topology { width:100%; height:auto; display:block; }
.link { stroke:#4d6a86; stroke-width:2.5; transition: stroke .3s; }
.link.live { stroke:#5fa0d8; }
.link.relay { stroke-dasharray: 8 5; }
.link.down { stroke:#3a4654; stroke-dasharray: 2 5; }
.link.partitioned { stroke:var(--bad); stroke-dasharray: 6 6; }
.link.pulse { animation: pulse .8s ease-out; }
@keyframes pulse { 0% { stroke:#ffffff; stroke-width:7; } 100% { stroke-width:2.5; } }
.cut { fill:var(--bad); font-weight:700; font-size:16px; text-anchor:middle; dominant-baseline:middle; }
.vertex circle { stroke:#0b1118; stroke-width:3; }
.vertex.stopped circle { fill:var(--bg) !important; stroke:var(--dim); stroke-dasharray:3 3; }
.vertex text { fill:var(--text); font-size:12px; text-anchor:middle; }
#cards { display:grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap:10px; }
.card { border:1px solid var(--line); border-radius:8px; padding:10px; background:#1b2733; }
.card.stopped { opacity:.55; }
.card h3 { display:flex; align-items:center; gap:8px; margin:0 0 6px; font-size:15px; }
.swatch { width:22px; height:22px; border-radius:5px; border:1px solid #0008; flex:none; }
.digest { font-family: ui-monospace, monospace; font-size:11px; color:var(--dim); }
.card dl { display:grid; grid-template-columns:auto 1fr; gap:1px 10px; margin:6px 0 0; font-size:12.5px; }
.card dt { color:var(--dim); } .card dd { margin:0; font-variant-numeric: tabular-nums; }
.needs { color:var(--warn); font-size:12.5px; margin-top:4px; }
.heads { font-family: ui-monospace, monospace; font-size:11px; color:var(--dim); word-break:break-all; }
.lower { display:grid; grid-template-columns: 1fr 1fr; gap:16px; padding:0 18px 18px; }
table { width:100%; border-collapse:collapse; font-size:12.5px; }
th, td { text-align:left; padding:3px 6px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--dim); font-weight:600; }
td.mono { font-family: ui-monospace, monospace; font-size:11.5px; }
.empty { color:var(--dim); font-style:italic; }
@media (max-width: 900px) { main, .lower { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<header>
  <h1 id="title">Shoal</h1>
  <span id="converged" class="badge no">waiting</span>
  <span class="metric">propagation p50 <b id="latency-p50" data-ms="">–</b> · p95 <b id="latency-p95" data-ms="">–</b> <span id="latency-n"></span></span>
  <span class="metric">converged after heal <b id="heal" data-ms="">–</b></span>
  <span id="stream">connecting…</span>
</header>
<div id="controls">
  <label>node <select id="node-a"></select></label>
  <label>and <select id="node-b"></select></label>
  <button id="btn-burst" data-action="burst">Write a burst</button>
  <button id="btn-partition" data-action="partition">Partition</button>
  <button id="btn-heal" data-action="heal">Heal</button>
  <button id="btn-stop" data-action="stop">Stop</button>
  <button id="btn-start" data-action="start">Start</button>
  <button id="btn-add-column" data-action="add-column">Add a column</button>
  <button id="btn-delete-rows" data-action="delete-rows">Delete many rows</button>
  <span id="message"></span>
</div>
<main>
  <section><h2>Topology</h2><svg id="topology" viewBox="0 0 400 340" role="img" aria-label="nodes and links"></svg></section>
  <section><h2>Nodes</h2><div id="cards"></div></section>
</main>
<div class="lower">
  <section><h2>Latest change sets</h2><table id="changesets"><thead><tr><th>origin</th><th>dot</th><th>tables</th><th>rows</th></tr></thead><tbody></tbody></table></section>
  <section><h2>Conflicts</h2><table id="conflicts"><thead><tr><th>node</th><th>row · column</th><th>values</th><th>winner, why</th></tr></thead><tbody></tbody></table></section>
</div>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const query = token ? "?token=" + encodeURIComponent(token) : "";
const SVG = "http://www.w3.org/2000/svg";
const page = { state: null, lastEventId: null, events: 0 };
window.shoalDashboard = page;

// The same digest gives the same colour on every card: hue, saturation and lightness from its first bytes.
function colour(digest) {
  if (!digest) return "rgb(90, 90, 90)";
  const a = parseInt(digest.slice(0, 4), 16), b = parseInt(digest.slice(4, 6), 16), c = parseInt(digest.slice(6, 8), 16);
  return "hsl(" + (a % 360) + ", " + (55 + b % 35) + "%, " + (42 + c % 22) + "%)";
}
function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function ms(value) {
  if (value === null || value === undefined) return "–";
  return value < 1000 ? value.toFixed(value < 10 ? 1 : 0) + " ms" : (value / 1000).toFixed(2) + " s";
}
function bytes(n) {
  if (n === null || n === undefined) return "–";
  return n < 1024 * 1024 ? (n / 1024).toFixed(0) + " KiB" : (n / 1048576).toFixed(1) + " MiB";
}
function setMetric(id, value) {
  const node = document.getElementById(id);
  node.textContent = ms(value);
  node.dataset.ms = value === null || value === undefined ? "" : String(value);
}

function renderHeader(s) {
  document.getElementById("title").textContent = s.title;
  document.title = s.title;
  const badge = document.getElementById("converged");
  badge.textContent = s.converged ? "converged" : "not converged";
  badge.className = "badge " + (s.converged ? "ok" : "no");
  setMetric("latency-p50", s.latency.p50Ms);
  setMetric("latency-p95", s.latency.p95Ms);
  document.getElementById("latency-n").textContent = s.latency.samples ? "(" + s.latency.samples + " applies)" : "";
  setMetric("heal", s.lastHealConvergeMs);
  if (s.healing) document.getElementById("heal").textContent = "healing…";
}

function renderControls(s) {
  const bar = document.getElementById("controls");
  bar.classList.toggle("on", !!s.controls);
  if (!s.controls) return;
  const a = document.getElementById("node-a"), b = document.getElementById("node-b");
  if (a.options.length !== s.nodes.length) {
    a.replaceChildren(...s.nodes.map(n => el("option", { value: n.index }, n.name)));
    b.replaceChildren(el("option", { value: "" }, "all others"), ...s.nodes.map(n => el("option", { value: n.index }, n.name)));
  }
  if (s.message) document.getElementById("message").textContent = s.message;
}

function renderCards(s) {
  const cards = document.getElementById("cards");
  cards.replaceChildren(...s.nodes.map(n => {
    const card = el("div", { class: "card" + (n.running ? "" : " stopped"), "data-node": n.index, "data-digest": n.digest || "" });
    const title = el("h3");
    const swatch = el("span", { class: "swatch", title: n.digest || "no digest" });
    swatch.style.background = colour(n.digest);
    title.append(swatch, el("span", { class: "name" }, n.name), el("span", { class: "digest" }, (n.digest || "").slice(0, 12)));
    card.append(title);
    const list = el("dl");
    const add = (k, v) => list.append(el("dt", {}, k), el("dd", {}, v));
    if (!n.running) add("state", "stopped");
    add("rows", n.rows ?? "–");
    add("tombstones", n.tombstones ?? "–");
    add("metadata", bytes(n.metadataBytes));
    add("file", bytes(n.fileBytes));
    add("pending", n.pending ?? "–");
    add("schema", n.schemaChanges === null || n.schemaChanges === undefined ? "–" : n.schemaChanges + (n.schemaPending ? " (+" + n.schemaPending + " pending)" : ""));
    add("conflicts", n.conflicts ?? "–");
    add("live peers", n.livePeers ?? "–");
    card.append(list);
    const heads = Object.entries(n.heads).sort().map(([k, v]) => k + ":" + v).join(" ");
    card.append(el("div", { class: "heads", title: "version vector" }, heads));
    for (const need of n.needs) card.append(el("div", { class: "needs" }, "needs " + need.changes + " change" + (need.changes === 1 ? "" : "s") + " from " + need.from));
    return card;
  }));
}

function renderTopology(s) {
  const view = document.getElementById("topology");
  const count = s.nodes.length, cx = 200, cy = 165, r = count > 1 ? 125 : 0;
  const at = i => [cx + r * Math.cos(2 * Math.PI * i / count - Math.PI / 2), cy + r * Math.sin(2 * Math.PI * i / count - Math.PI / 2)];
  const previous = new Map([...view.querySelectorAll(".link")].map(l => [l.dataset.a + "-" + l.dataset.b, l]));
  const fresh = [];
  for (const link of s.links) {
    if (link.a >= count || link.b >= count) continue;
    const [x1, y1] = at(link.a), [x2, y2] = at(link.b);
    const line = previous.get(link.a + "-" + link.b) || svg("line");
    line.setAttribute("x1", x1); line.setAttribute("y1", y1); line.setAttribute("x2", x2); line.setAttribute("y2", y2);
    line.setAttribute("class", "link " + link.state + (link.kind === "relay" ? " relay" : ""));
    line.dataset.a = link.a; line.dataset.b = link.b; line.dataset.state = link.state; line.dataset.kind = link.kind;
    if (link.pulse) { void line.getBBox(); line.classList.add("pulse"); }
    fresh.push(line);
    if (link.state === "partitioned") {
      const cut = svg("text", { class: "cut", x: (x1 + x2) / 2, y: (y1 + y2) / 2 });
      cut.textContent = "✕";
      fresh.push(cut);
    }
  }
  const vertices = s.nodes.map((n, i) => {
    const [x, y] = at(i);
    const group = svg("g", { class: "vertex" + (n.running ? "" : " stopped"), "data-node": n.index });
    const circle = svg("circle", { cx: x, cy: y, r: 17 });
    circle.style.fill = colour(n.digest);
    const label = svg("text", { x: x, y: y + (y < cy ? -24 : 32) });
    label.textContent = n.name;
    group.append(circle, label);
    return group;
  });
  view.replaceChildren(...fresh, ...vertices);
}

function cell(text, mono) { return el("td", mono ? { class: "mono" } : {}, text); }
function renderTables(s) {
  const sets = document.querySelector("#changesets tbody");
  sets.replaceChildren(...(s.changeSets.length ? s.changeSets.map(c => {
    const row = el("tr"); row.append(cell(c.origin), cell(c.dot, true), cell(c.tables.join(", ")), cell(String(c.rows))); return row;
  }) : [emptyRow(4, "no change sets yet")]));
  const conflicts = document.querySelector("#conflicts tbody");
  conflicts.replaceChildren(...(s.conflicts.length ? s.conflicts.map(c => {
    const row = el("tr");
    row.append(cell(c.node), cell(c.table + " " + c.key + " · " + c.column, true), cell("here " + c.local + " / arrived " + c.remote, true), cell(c.winner + ": " + c.why));
    return row;
  }) : [emptyRow(4, "no conflicts recorded")]));
}
function emptyRow(span, text) { const row = el("tr"); row.append(el("td", { colspan: span, class: "empty" }, text)); return row; }

function render(s) {
  page.state = s;
  renderHeader(s); renderControls(s); renderCards(s); renderTopology(s); renderTables(s);
}

async function control(action) {
  const a = document.getElementById("node-a").value, b = document.getElementById("node-b").value;
  const body = { action: action, node: Number(a) };
  if ((action === "partition" || action === "heal") && b !== "") body.peer = Number(b);
  const message = document.getElementById("message");
  message.textContent = action + "…";
  try {
    const response = await fetch("/control" + query, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const answer = await response.json();
    message.textContent = answer.message;
  } catch (error) {
    message.textContent = "the control failed: " + error;
  }
}
for (const button of document.querySelectorAll("#controls button")) button.addEventListener("click", () => control(button.dataset.action));

// Live states: the browser reconnects by itself, sending the last event's id (Last-Event-ID), and the server resumes
// after it.
const events = new EventSource("/events" + query);
events.addEventListener("state", event => {
  page.lastEventId = event.lastEventId; page.events += 1;
  render(JSON.parse(event.data));
});
events.onopen = () => { document.getElementById("stream").textContent = "live"; };
events.onerror = () => { document.getElementById("stream").textContent = "reconnecting…"; };
</script>
</body>
</html>
"""#
}
