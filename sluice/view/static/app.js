// sluice view: the page over a capture. Served by `sluice view` (data from
// /api/...) or exported into one file (data in #sluice-data). No libraries.
"use strict";

const PAGE = 200;
const embedded = document.getElementById("sluice-data");
const DATA = embedded ? JSON.parse(embedded.textContent) : null;
const $ = (id) => document.getElementById(id);
const state = { offset: 0, total: 0, selected: null, connections: [] };
const FIELDS = ["cmd", "topic", "producer", "consumer", "conn", "from", "to", "problems"];

function escape(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// The filter lives in the URL's fragment, so a link carries it.
function currentFilter() {
  const params = new URLSearchParams(location.hash.slice(1));
  const filter = {};
  for (const key of FIELDS) if (params.get(key)) filter[key] = params.get(key);
  return filter;
}

function setFilter(filter, frame) {
  const params = new URLSearchParams();
  for (const key of FIELDS) if (filter[key]) params.set(key, filter[key]);
  if (frame !== undefined && frame !== null) params.set("frame", frame);
  const hash = "#" + params.toString();
  if (location.hash !== hash) history.pushState(null, "", hash);
}

async function api(path, params) {
  const query = params ? "?" + new URLSearchParams(params).toString() : "";
  const answer = await fetch("api/" + path + query);
  const data = await answer.json();
  if (!answer.ok) throw new Error(data.error || answer.statusText);
  return data;
}

// In an exported file the same questions are answered from the data in it.
function matches(row, f) {
  if (f.cmd && row.cmd !== f.cmd.toUpperCase()) return false;
  if (f.topic && !(row.topic === f.topic || row.topic.endsWith("/" + f.topic) || row.topic.includes(f.topic))) return false;
  if (f.conn && String(row.conn) !== String(f.conn)) return false;
  if (f.from && row.t < Number(f.from)) return false;
  if (f.to && row.t > Number(f.to)) return false;
  if (f.problems && !row.flags.some((x) => x !== "redacted" && x !== "filtered")) return false;
  if (f.producer || f.consumer) return false; // not in exported rows
  return true;
}

async function getFrames(filter, offset) {
  if (!DATA) return api("frames", { ...filter, offset, limit: PAGE });
  const rows = DATA.frames.filter((r) => matches(r, filter));
  return { total: rows.length, offset, rows: rows.slice(offset, offset + PAGE), building: false };
}

async function getDetail(i) {
  if (!DATA) return api("frame/" + i);
  const found = DATA.details[String(i)];
  if (!found) throw new Error("this frame's detail is not in the exported file");
  return found;
}

async function getTimeline(filter) {
  if (!DATA) return api("timeline", filter);
  return DATA.timeline;
}

function showStatus(status) {
  const parts = [escape(status.target), `${status.frames} frames`, `${status.connections} connections`,
                 `${status.files} file(s)`, escape(status.protocol)];
  if (status.building) parts.push(`indexing ${(100 * status.progress).toFixed(0)}%`);
  if (DATA) parts.push(`exported: ${DATA.frames.length} of ${DATA.total} matching frames` +
                       (DATA.left_out ? `, ${DATA.left_out} left out` : ""));
  $("status").innerHTML = parts.join(" · ");
  const problems = [];
  if (status.error) problems.push(escape(status.error));
  for (const t of status.truncated || []) problems.push(escape(t));
  $("problem").hidden = problems.length === 0;
  $("problem").innerHTML = problems.join("<br>");
}

function showConnections(connections) {
  state.connections = connections;
  const body = $("connections").tBodies[0];
  body.innerHTML = connections.map((c) =>
    `<tr class="${c.problems ? "bad" : ""}" data-conn="${c.id}"><td>${escape(c.name)}</td><td>${escape(c.kind)}</td>` +
    `<td title="${c.via ? "via " + escape(c.via) : ""}">${escape(c.client)}</td>` +
    `<td>${escape(c.broker)}</td><td>${c.start.toFixed(3)}</td>` +
    `<td>${c.duration.toFixed(3)}</td><td>${c.frames}</td><td>${c.problems}</td></tr>`).join("");
  const select = document.querySelector("select[name=conn]");
  const chosen = currentFilter().conn || "";
  select.innerHTML = '<option value="">any</option>' + connections.map((c) =>
    `<option value="${c.id}">${escape(c.name)} ${escape(c.client)}</option>`).join("");
  select.value = chosen;
}

function showFrames(page) {
  state.total = page.total;
  const body = $("frames").tBodies[0];
  body.innerHTML = page.rows.map((r) => {
    const flags = r.flags.map((f) => `<span class="flag ${f}">${f}</span>`).join("");
    const bad = r.flags.some((f) => f !== "redacted" && f !== "gap" && f !== "filtered");
    return `<tr data-frame="${r.i}" class="${bad ? "bad" : ""} ${r.flags.includes("gap") ? "gap" : ""}">` +
      `<td>${r.i}</td><td>${r.t.toFixed(6)}</td><td>${escape(state.connections[r.conn]?.name ?? r.conn)}</td>` +
      `<td>${r.dir}</td><td>${escape(r.cmd)}</td><td class="topic" title="${escape(r.topic)}">${escape(r.topic)}</td>` +
      `<td>${r.size}</td><td>${r.latency === null ? "" : (1000 * r.latency).toFixed(2) + " ms"}</td>` +
      `<td>${flags}${escape(r.problem)}</td></tr>`;
  }).join("");
  $("count").textContent = `(${page.total} match${page.building ? ", still indexing" : ""})`;
  const last = Math.min(page.offset + PAGE, page.total);
  $("where").textContent = page.total ? `${page.offset + 1}–${last} of ${page.total}` : "no frames match";
  $("prev").disabled = page.offset === 0;
  $("next").disabled = last >= page.total;
  markSelected();
}

// The HTTP listener's exchanges (sluice proxy --http-listen): a table of
// their own, filtered by path (a part of it) and status (404, or 4xx).
async function getHttp(filter) {
  if (!DATA) return api("http", filter);
  const rows = (DATA.http || []).filter((e) =>
    (!filter.path || e.path.includes(filter.path)) &&
    (!filter.status || (filter.status.endsWith("xx") ? String(e.status)[0] === filter.status[0]
                                                     : String(e.status) === filter.status)));
  return { total: rows.length, offset: 0, rows };
}

async function refreshHttp(status) {
  if (!status.http) return;
  $("http").hidden = false;
  const form = new FormData($("http-filters"));
  const filter = {};
  for (const key of ["path", "status"]) if (form.get(key)) filter[key] = form.get(key);
  try {
    const page = await getHttp(filter);
    $("http-count").textContent = `(${page.total} match)`;
    $("exchanges").tBodies[0].innerHTML = page.rows.map((e) => {
      const notes = [];
      if (e.redirects) notes.push(`redirected ${e.redirects}`);
      if (e.refused) notes.push(`answered by Sluice: ${e.refused}`);
      if (e.ended) notes.push(`ended: ${e.ended}`);
      if (e.frames) notes.push(`${e.frames} WebSocket frames` + (e.session ? ` (${e.session})` : ""));
      if (e.redacted) notes.push("credentials redacted");
      return `<tr class="${e.status >= 500 || !e.status ? "bad" : ""}"><td>${e.i}</td><td>${e.t.toFixed(6)}</td>` +
        `<td>h${e.conn}</td><td>${escape(e.method)}</td><td class="topic" title="${escape(e.path)}">${escape(e.path)}</td>` +
        `<td>${e.status || ""}</td><td>${escape(e.kind)}</td><td>${(1000 * e.seconds).toFixed(1)}</td>` +
        `<td>${e.request_bytes}</td><td>${e.response_bytes}</td><td>${escape(notes.join(", "))}</td></tr>`;
    }).join("");
  } catch (error) {
    $("http-count").textContent = error.message;
  }
}

function markSelected() {
  for (const row of $("frames").tBodies[0].rows)
    row.classList.toggle("selected", row.dataset.frame === String(state.selected));
}

function showTimeline(data) {
  // A lane per connection, and one for the HTTP listener's exchanges when
  // the capture has any (a bar from request to answer, coloured by status).
  const http = data.http || [];
  const httpLane = state.connections.length;
  const lanes = httpLane + (http.length ? 1 : 0) || 1;
  const width = 1000, lane = 14, height = lanes * lane + 20;
  const end = Math.max(1e-6, ...data.marks.map((m) => m[2]), ...http.map((e) => e[1] + e[2]));
  const x = (t) => 60 + (t / end) * (width - 70);
  const parts = [`<svg viewBox="0 0 ${width} ${height}" role="img" aria-label="timeline">`];
  state.connections.forEach((c, n) =>
    parts.push(`<text class="lane" x="2" y="${n * lane + 11}">${escape(c.name)}</text>`));
  for (const [i, conn, t, dir, bad, pair] of data.marks) {
    const y = conn * lane + (dir ? 8 : 2);
    if (pair >= 0 && dir === 0) {
      const other = data.marks.find((m) => m[0] === pair);
      if (other) parts.push(`<line x1="${x(t)}" y1="${y + 2}" x2="${x(other[2])}" y2="${y + 8}" stroke="#aab7b8"/>`);
    }
    parts.push(`<rect data-frame="${i}" x="${x(t)}" y="${y}" width="${bad ? 3 : 1.5}" height="4" ` +
               `fill="${bad ? "#c0392b" : dir ? "#2e86c1" : "#1e8449"}"><title>#${i}</title></rect>`);
  }
  if (http.length) {
    const y = httpLane * lane;
    parts.push(`<text class="lane" x="2" y="${y + 11}">http</text>`);
    for (const [i, t, seconds, status] of http) {
      const fill = status >= 500 || !status ? "#c0392b" : status >= 400 ? "#d68910" : "#7d3c98";
      const w = Math.max(1.5, x(t + seconds) - x(t));
      parts.push(`<rect data-exchange="${i}" x="${x(t)}" y="${y + 4}" width="${w}" height="6" ` +
                 `fill="${fill}"><title>exchange #${i}: ${status || "no answer"}</title></rect>`);
    }
  }
  for (const note of data.notes || []) {
    const lineAt = x(note.t);
    parts.push(`<line x1="${lineAt}" y1="0" x2="${lineAt}" y2="${height}" stroke="#d68910" stroke-dasharray="2,2"><title>${escape(note.text)}</title></line>`);
  }
  parts.push(`<text class="lane" x="60" y="${height - 4}">0 s</text><text class="lane" x="${width - 60}" y="${height - 4}">${end.toFixed(2)} s</text>`);
  parts.push("</svg>");
  $("timeline").innerHTML = parts.join("") + (data.sampled ? `<p class="hint">${data.frames} frames: a sample is drawn, every problem included.</p>` : "");
}

function showSummary(summary) {
  const parts = [`<p>${summary.frames} frames over ${summary.seconds.toFixed(2)} s on ${summary.connections} connections.</p>`];
  if (summary.topics.length) {
    parts.push("<table><thead><tr><th>topic</th><th>frames</th><th>per s</th></tr></thead><tbody>");
    for (const t of summary.topics) parts.push(`<tr><td class="topic">${escape(t.topic)}</td><td>${t.frames}</td><td>${t.per_second.toFixed(1)}</td></tr>`);
    parts.push("</tbody></table>");
  }
  const buckets = summary.latency.buckets;
  for (const [cmd, counts] of Object.entries(summary.latency.by_command)) {
    const most = Math.max(...counts, 1);
    parts.push(`<h3>${escape(cmd)} latency</h3><svg viewBox="0 0 ${counts.length * 24} 60" width="${counts.length * 24}" height="60">`);
    counts.forEach((n, b) => {
      const h = (50 * n) / most;
      const label = b < buckets.length ? `≤ ${buckets[b] * 1000} ms` : `> ${buckets[buckets.length - 1] * 1000} ms`;
      parts.push(`<rect class="bar" x="${b * 24 + 2}" y="${50 - h}" width="20" height="${h}"><title>${label}: ${n}</title></rect>`);
    });
    parts.push("</svg>");
  }
  if (summary.errors.length) {
    parts.push("<h3>Most frequent errors</h3><ul>");
    for (const e of summary.errors) parts.push(`<li>${escape(e.error)} × ${e.count}</li>`);
    parts.push("</ul>");
  }
  $("summary").innerHTML = parts.join("");
  $("commands").innerHTML = [...new Set(Object.keys(summary.latency.by_command))]
    .map((c) => `<option value="${escape(c)}">`).join("");
}

async function showDetail(i) {
  state.selected = i;
  markSelected();
  setFilter(currentFilter(), i);
  try {
    const d = await getDetail(i);
    const rows = [["frame", `#${d.i} ${escape(d.cmd)} ${d.dir}`], ["time", `${d.t.toFixed(6)} s (${escape(d.time)} UTC)`],
                  ["connection", escape(state.connections[d.conn]?.name ?? d.conn)], ["topic", escape(d.topic)], ["size", `${d.size} bytes`],
                  ["file", escape(d.file)]];
    if (d.problem) rows.push(["problem", escape(d.problem)]);
    if (d.flags.length) rows.push(["marks", escape(d.flags.join(", "))]);
    if (d.pair !== null) rows.push([d.dir === "C→B" ? "answered by" : "answers",
      `<a href="#" data-frame="${d.pair}">#${d.pair}</a>` + (d.latency !== null ? ` after ${(1000 * d.latency).toFixed(3)} ms` : "")]);
    if (d.payload) rows.push(["payload", `${d.payload.size} bytes` + (d.payload.sha256 ? `, sha256 ${escape(d.payload.sha256)}` : "")]);
    let html = "<dl>" + rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("") + "</dl>";
    html += `<h3>Command</h3><pre id="command">${escape(JSON.stringify(d.command, null, 2))}</pre>`;
    if (d.metadata) html += `<h3>Message metadata</h3><pre>${escape(JSON.stringify(d.metadata, null, 2))}</pre>`;
    if (d.payload && d.payload.text !== undefined) html += `<h3>Payload as text${d.payload.cut ? " (start)" : ""}</h3><pre>${escape(d.payload.text)}</pre>`;
    html += `<h3>Raw bytes (${d.raw_size}${d.raw_cut ? ", first 4096 shown" : ""})</h3><pre>${escape(d.raw_hex)}</pre>`;
    $("detail").innerHTML = html;
  } catch (error) {
    $("detail").innerHTML = `<p class="problem">${escape(error.message)}</p>`;
  }
}

async function refresh() {
  const filter = currentFilter();
  const form = $("filters");
  for (const key of FIELDS) {
    const input = form.elements[key];
    if (!input) continue;
    if (input.type === "checkbox") input.checked = !!filter[key];
    else input.value = filter[key] || "";
  }
  $("link").href = location.href;
  try {
    const page = await getFrames(filter, state.offset);
    showFrames(page);
    showTimeline(await getTimeline(filter));
  } catch (error) {
    $("problem").hidden = false;
    $("problem").textContent = error.message;
  }
  const frame = new URLSearchParams(location.hash.slice(1)).get("frame");
  if (frame !== null && String(state.selected) !== frame) showDetail(Number(frame));
}

async function start() {
  let status = DATA ? DATA.status : await api("status");
  showStatus(status);
  showConnections(DATA ? DATA.connections : await api("connections"));
  await refresh();
  // While the index is being built: keep the counts and the first page current.
  while (!DATA && status.building) {
    await new Promise((r) => setTimeout(r, 500));
    status = await api("status");
    showStatus(status);
    showConnections(await api("connections"));
    if (state.total < PAGE || !status.building) await refresh();
  }
  showSummary(DATA ? DATA.summary : await api("summary"));
  state.status = status;
  await refreshHttp(status);
}

$("http-filters").addEventListener("submit", (event) => {
  event.preventDefault();
  if (state.status) refreshHttp(state.status);
});

$("filters").addEventListener("submit", (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const filter = {};
  for (const key of FIELDS) if (form.get(key)) filter[key] = form.get(key);
  state.offset = 0;
  setFilter(filter);
  refresh();
});
$("clear").addEventListener("click", () => { state.offset = 0; setFilter({}); refresh(); });
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
$("next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
document.addEventListener("click", (event) => {
  const target = event.target.closest("[data-frame]");
  if (target) { event.preventDefault(); showDetail(Number(target.dataset.frame)); }
  const conn = event.target.closest("tr[data-conn]");
  if (conn) { state.offset = 0; setFilter({ ...currentFilter(), conn: conn.dataset.conn }); refresh(); }
});
window.addEventListener("popstate", () => { state.offset = 0; refresh(); });
start().catch((error) => { $("problem").hidden = false; $("problem").textContent = error.message; });
