// sluice view: the page over a capture. Served by `sluice view` (data from
// /api/...) or exported into one file (data in #sluice-data). No libraries.
"use strict";

const PAGE = 200;
const SEQUENCE = 400; // arrows in the sequence diagram at most (the server's limit)
const CONNECTIONS = 500; // rows in the connections table at most (a capture's first, a live view's newest)
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
  if (f.producer && String(row.pid) !== String(Math.trunc(Number(f.producer)))) return false;
  if (f.consumer && String(row.cid) !== String(Math.trunc(Number(f.consumer)))) return false;
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
  const parts = status.live
    ? [`live: ${escape(status.source)}`, `${escape(status.frames)} frames`, `${escape(status.connections)} connections`,
       escape(status.protocol)]
    : [escape(status.target), `${escape(status.frames)} frames`, `${escape(status.connections)} connections`,
       `${escape(status.files)} file(s)`, escape(status.protocol)];
  if (status.live && status.dropped_upstream) parts.push(`${escape(status.dropped_upstream)} records dropped by the proxy before they were read`);
  if (status.live && status.restarts) parts.push(`the proxy restarted ${escape(status.restarts)} time(s) while watched`);
  if (status.live && status.let_go) parts.push(`${escape(status.let_go)} oldest frames let go here (it holds at most ${escape(status.max_frames)} frames, ${escape(status.max_mib)} MiB)`);
  if (status.building) parts.push(`indexing ${(100 * status.progress).toFixed(0)}%`);
  if (DATA) parts.push(`exported: ${escape(DATA.frames.length)} of ${escape(DATA.total)} matching frames` +
                       (DATA.left_out ? `, ${escape(DATA.left_out)} left out` : ""));
  $("status").innerHTML = parts.join(" · ");
  const problems = [];
  if (status.error) problems.push(escape(status.error));
  for (const t of status.truncated || []) problems.push(escape(t));
  $("problem").hidden = problems.length === 0;
  $("problem").innerHTML = problems.join("<br>");
}

async function getConnections() {
  return DATA ? DATA.connections : api("connections", { limit: CONNECTIONS });
}

// At most CONNECTIONS of them (the page took minutes over a capture of
// 100,000 connections); frames and the timeline carry their connections' names.
function showConnections(connections, total) {
  state.connections = connections;
  const body = $("connections").tBodies[0];
  body.innerHTML = connections.map((c) =>
    `<tr class="${c.problems ? "bad" : ""}" data-conn="${escape(c.id)}"><td>${escape(c.name)}</td><td>${escape(c.kind)}</td>` +
    `<td title="${c.via ? "via " + escape(c.via) : ""}">${escape(c.client)}</td>` +
    `<td>${escape(c.broker)}</td><td>${c.start.toFixed(3)}</td>` +
    `<td>${c.duration.toFixed(3)}</td><td>${escape(c.frames)}</td><td>${escape(c.problems)}</td></tr>`).join("");
  $("connections-count").textContent = total > connections.length ? `(${connections.length} of ${total})` : "";
  const select = document.querySelector("select[name=conn]");
  const chosen = currentFilter().conn || "";
  const listed = connections.some((c) => String(c.id) === chosen);
  select.innerHTML = '<option value="">any</option>' + connections.map((c) =>
    `<option value="${escape(c.id)}">${escape(c.name)} ${escape(c.client)}</option>`).join("") +
    (chosen && !listed ? `<option value="${escape(chosen)}">connection ${escape(chosen)}</option>` : "");
  select.value = chosen;
}

function showFrames(page) {
  state.total = page.total;
  const body = $("frames").tBodies[0];
  body.innerHTML = page.rows.map((r) => {
    const flags = r.flags.map((f) => `<span class="flag ${escape(f)}">${escape(f)}</span>`).join("");
    const bad = r.flags.some((f) => f !== "redacted" && f !== "gap" && f !== "filtered");
    return `<tr data-frame="${escape(r.i)}" class="${bad ? "bad" : ""} ${r.flags.includes("gap") ? "gap" : ""}">` +
      `<td>${escape(r.i)}</td><td>${r.t.toFixed(6)}</td><td>${escape(r.name)}</td>` +
      `<td>${escape(r.dir)}</td><td>${escape(r.cmd)}</td><td class="topic" title="${escape(r.topic)}">${escape(r.topic)}</td>` +
      `<td>${escape(r.size)}</td><td>${r.latency === null ? "" : (1000 * r.latency).toFixed(2) + " ms"}</td>` +
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
  // (as the server reads them: trimmed, a class in either case)
  const path = (filter.path || "").trim(), status = (filter.status || "").trim().toLowerCase();
  const rows = (DATA.http || []).filter((e) =>
    (!path || e.path.includes(path)) &&
    (!status || (status.endsWith("xx") ? String(e.status)[0] === status[0]
                                       : String(e.status) === status)));
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
      return `<tr class="${e.status >= 500 || !e.status ? "bad" : ""}"><td>${escape(e.i)}</td><td>${e.t.toFixed(6)}</td>` +
        `<td>h${escape(e.conn)}</td><td>${escape(e.method)}</td><td class="topic" title="${escape(e.path)}">${escape(e.path)}</td>` +
        `<td>${escape(e.status || "")}</td><td>${escape(e.kind)}</td><td>${(1000 * e.seconds).toFixed(1)}</td>` +
        `<td>${escape(e.request_bytes)}</td><td>${escape(e.response_bytes)}</td><td>${escape(notes.join(", "))}</td></tr>`;
    }).join("");
  } catch (error) {
    $("http-count").textContent = error.message;
  }
}

function markSelected() {
  for (const row of $("frames").tBodies[0].rows)
    row.classList.toggle("selected", row.dataset.frame === String(state.selected));
  for (const arrow of document.querySelectorAll("#sequence .arrow"))
    arrow.classList.toggle("selected", arrow.dataset.frame === String(state.selected));
}

// Ticks for an axis from 0 to ``top``: about ``count`` round steps (1, 2, 5 × 10^k);
// with ``cover`` the last is at or above ``top`` (a value axis's top).
function ticks(top, count, cover = false) {
  if (!(top > 0)) return [0];
  const raw = top / count, power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const out = [];
  for (let v = 0; v <= top * 1.0001; v += step) out.push(Number(v.toPrecision(12)));
  if (cover && out[out.length - 1] < top) out.push(Number((out[out.length - 1] + step).toPrecision(12)));
  return out;
}

function seconds(v) {
  return v >= 100 ? v.toFixed(0) : v >= 1 ? String(Number(v.toFixed(2))) : String(Number(v.toFixed(4)));
}

function showTimeline(data) {
  // A lane per connection, and one for the HTTP listener's exchanges when
  // the capture has any (a bar from request to answer, coloured by status).
  const http = data.http || [];
  const names = data.lanes || [];  // [id, name] of each connection a mark is on
  const laneOf = new Map(names.map(([id], n) => [id, n]));
  const httpLane = names.length;
  const lanes = httpLane + (http.length ? 1 : 0) || 1;
  const width = 1000, lane = 14, height = lanes * lane + 30;
  const end = Math.max(1e-6, ...data.marks.map((m) => m[2]), ...http.map((e) => e[1] + e[2]));
  const x = (t) => 60 + (t / end) * (width - 70);
  const parts = [`<svg viewBox="0 0 ${width} ${height}" role="img" aria-label="timeline">`];
  names.forEach(([, name], n) =>
    parts.push(`<text class="lane" x="2" y="${n * lane + 11}">${escape(name)}</text>`));
  // Marks by frame id, for a request's line to its answer (a search of
  // every mark for each was 64 million steps at 8,000 marks, every second
  // of a live view).
  const byId = new Map(data.marks.map((m) => [m[0], m]));
  for (const [i, conn, t, dir, bad, pair] of data.marks) {
    if (!laneOf.has(conn)) continue;
    const y = laneOf.get(conn) * lane + (dir ? 8 : 2);
    if (pair >= 0 && dir === 0) {
      const other = byId.get(pair);
      if (other) parts.push(`<line class="pair" x1="${x(t)}" y1="${y + 2}" x2="${x(other[2])}" y2="${y + 8}" stroke="#aab7b8"/>`);
    }
    parts.push(`<rect data-frame="${escape(i)}" x="${x(t)}" y="${y}" width="${bad ? 3 : 1.5}" height="4" ` +
               `fill="${bad ? "#c0392b" : dir ? "#2e86c1" : "#1e8449"}"><title>#${escape(i)}</title></rect>`);
  }
  if (http.length) {
    const y = httpLane * lane;
    parts.push(`<text class="lane" x="2" y="${y + 11}">http</text>`);
    for (const [i, t, seconds, status] of http) {
      const fill = status >= 500 || !status ? "#c0392b" : status >= 400 ? "#d68910" : "#7d3c98";
      const w = Math.max(1.5, x(t + seconds) - x(t));
      parts.push(`<rect data-exchange="${escape(i)}" x="${x(t)}" y="${y + 4}" width="${w}" height="6" ` +
                 `fill="${fill}"><title>exchange #${escape(i)}: ${escape(status || "no answer")}</title></rect>`);
    }
  }
  for (const note of data.notes || []) {
    const lineAt = x(note.t);
    parts.push(`<line x1="${lineAt}" y1="0" x2="${lineAt}" y2="${height}" stroke="#d68910" stroke-dasharray="2,2"><title>${escape(note.text)}</title></line>`);
  }
  // The time axis: seconds from the capture's start, with round ticks.
  parts.push(`<line x1="60" y1="${height - 18}" x2="${width - 10}" y2="${height - 18}" stroke="#aab7b8"/>`);
  for (const v of ticks(end, 8)) {
    parts.push(`<line x1="${x(v)}" y1="${height - 18}" x2="${x(v)}" y2="${height - 14}" stroke="#aab7b8"/>` +
               `<text class="axis" x="${x(v)}" y="${height - 5}" text-anchor="middle">${seconds(v)} s</text>`);
  }
  parts.push(`<text class="axis" x="2" y="${height - 5}">time →</text>`);
  parts.push("</svg>");
  const left = data.lanes_total > names.length
    ? `<p class="hint">lanes for ${escape(names.length)} of the ${escape(data.lanes_total)} connections with frames: filter by a connection to see another.</p>` : "";
  $("timeline").innerHTML = parts.join("") + left + (data.sampled ? `<p class="hint">${escape(data.frames)} frames: a sample is drawn, ${data.problems_sampled ? `and of the ${escape(data.problems)} problems a sample too` : "every problem included"}.</p>` : "");
}

function showSummary(summary) {
  const from = summary.started_wall ? new Date(summary.started_wall * 1000) : null;
  const to = from ? new Date(from.getTime() + summary.seconds * 1000) : null;
  const utc = (d) => d.toISOString().replace("T", " ").slice(0, 19);
  const range = from ? `, from ${utc(from)} to ${utc(to)} UTC` : "";
  const parts = [`<p id="range">${escape(summary.frames)} frames over ${summary.seconds.toFixed(2)} s${range} on ${escape(summary.connections)} connections.</p>`];
  if (summary.topics.length) {
    parts.push("<table><thead><tr><th>topic</th><th>frames</th><th>per s</th></tr></thead><tbody>");
    for (const t of summary.topics) parts.push(`<tr><td class="topic">${escape(t.topic)}</td><td>${escape(t.frames)}</td><td>${t.per_second.toFixed(1)}</td></tr>`);
    parts.push("</tbody></table>");
  }
  if (summary.rates && summary.rates.series.length) parts.push(ratesPlot(summary));
  const buckets = summary.latency.buckets;
  for (const [cmd, counts] of Object.entries(summary.latency.by_command)) {
    parts.push(latencyPlot(cmd, counts, buckets));
  }
  if (summary.errors.length) {
    parts.push("<h3>Most frequent errors</h3><ul>");
    for (const e of summary.errors) parts.push(`<li>${escape(e.error)} × ${escape(e.count)}</li>`);
    parts.push("</ul>");
  }
  $("summary").innerHTML = parts.join("");
  $("commands").innerHTML = [...new Set(Object.keys(summary.latency.by_command))]
    .map((c) => `<option value="${escape(c)}">`).join("");
}

const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];

// Messages per second by topic over the capture: a line per topic and
// direction, axes in seconds and msg/s, the value of each bin on hover.
function ratesPlot(summary) {
  const rates = summary.rates, bin = rates.bin_seconds;
  const width = 460, height = 210, left = 48, bottom = 30, top = 22, right = 10;
  const most = Math.max(1e-9, ...rates.series.flatMap((s) => s.per_second));
  const yTicks = ticks(most, 4, true), yTop = yTicks[yTicks.length - 1] || most;
  const span = bin * rates.series[0].per_second.length;
  const x = (t) => left + (t / span) * (width - left - right);
  const y = (v) => height - bottom - (v / yTop) * (height - bottom - top);
  const parts = [`<h3>Messages per second by topic</h3>`,
    `<svg class="plot" id="rates" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="messages per second by topic">`];
  for (const v of yTicks) {
    parts.push(`<line class="grid" x1="${left}" y1="${y(v)}" x2="${width - right}" y2="${y(v)}"/>` +
               `<text class="axis" x="${left - 4}" y="${y(v) + 3}" text-anchor="end">${seconds(v)}</text>`);
  }
  for (const v of ticks(span, 6)) {
    parts.push(`<text class="axis" x="${x(v)}" y="${height - bottom + 12}" text-anchor="middle">${seconds(v)} s</text>`);
  }
  parts.push(`<text class="axis" x="${left}" y="${height - 4}">time from the capture's start (bins of ${seconds(bin)} s)</text>`);
  parts.push(`<text class="axis" x="4" y="11">msg/s</text>`);
  rates.series.forEach((s, n) => {
    const colour = COLOURS[n % COLOURS.length];
    const points = s.per_second.map((v, b) => [x((b + 0.5) * bin), y(v), v, b]);
    const dashed = s.direction === "delivered" ? ' stroke-dasharray="5,3"' : "";  // over its produced line
    parts.push(`<polyline fill="none" stroke="${colour}" stroke-width="1.5"${dashed} points="${points.map((p) => p[0] + "," + p[1]).join(" ")}"/>`);
    for (const [px, py, v, b] of points) {
      parts.push(`<circle cx="${px}" cy="${py}" r="2.5" fill="${colour}"><title>${escape(s.topic)} ${escape(s.direction)}: ` +
                 `${escape(v)} msg/s, ${seconds(b * bin)}–${seconds((b + 1) * bin)} s</title></circle>`);
    }
  });
  parts.push("</svg><ul class=\"legend\">");
  rates.series.forEach((s, n) => parts.push(
    `<li title="${escape(s.topic)}"><span class="swatch" style="background:${COLOURS[n % COLOURS.length]}"></span>` +
    `${escape(s.topic.split("/").pop())} ${escape(s.direction)}: ${escape(s.messages)} messages</li>`));
  parts.push("</ul>");
  if (rates.topics > rates.series.length) parts.push(`<p class="hint">the ${escape(rates.series.length)} busiest of ${escape(rates.topics)}</p>`);
  return parts.join("");
}

// A latency histogram: answers per bucket (upper bounds, in ms), with axes,
// the count over each bar, and bucket and count on hover.
function latencyPlot(cmd, counts, buckets) {
  const most = Math.max(...counts, 1), bar = 26, left = 36, height = 120, base = 80;
  const width = left + counts.length * bar + 10;
  const ms = (s) => String(Number((s * 1000).toPrecision(3)));
  const parts = [`<h3>${escape(cmd)} latency</h3>`,
    `<svg class="plot latency" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="${escape(cmd)} latency">`,
    `<line x1="${left}" y1="${base}" x2="${width - 6}" y2="${base}" stroke="#aab7b8"/>`,
    `<text class="axis" x="${left - 4}" y="${base}" text-anchor="end">0</text>`,
    `<text class="axis" x="${left - 4}" y="18" text-anchor="end">${escape(most)}</text>`,
    `<text class="axis" x="2" y="10">answers</text>`];
  counts.forEach((n, b) => {
    const h = (60 * n) / most, x = left + b * bar + 2;
    const label = b < buckets.length ? `≤ ${ms(buckets[b])} ms` : `> ${ms(buckets[buckets.length - 1])} ms`;
    parts.push(`<rect class="bar" x="${x}" y="${base - h}" width="${bar - 4}" height="${h}"><title>${label}: ${escape(n)} answers</title></rect>`);
    if (n) parts.push(`<text class="axis" x="${x + (bar - 4) / 2}" y="${base - h - 2}" text-anchor="middle">${escape(n)}</text>`);
    const tick = b < buckets.length ? ms(buckets[b]) : ">" + ms(buckets[buckets.length - 1]);
    parts.push(`<text class="axis" x="${x + (bar - 4) / 2}" y="${base + 11}" text-anchor="middle">${tick}</text>`);
  });
  parts.push(`<text class="axis" x="${left}" y="${height - 6}">latency, ms (each bar: up to its bound)</text></svg>`);
  return parts.join("");
}

// The sequence diagram: lanes for the clients, Sluice and the brokers, one
// arrow per frame in time order (through Sluice when it relays), problems
// in red, Sluice's own answers dashed; an arrow shows its frame.
async function getSequence(filter, offset) {
  if (!DATA) return api("sequence", { ...filter, offset: offset || 0 });
  return DATA.sequence;
}

function showSequence(data) {
  const lanes = data.lanes, arrows = data.arrows;
  if (!arrows.length) {
    $("sequence").innerHTML = '<p class="hint">no frames match</p>';
    $("sequence-count").textContent = "";
    return;
  }
  const left = 130, column = 230, row = 24, head = 36;
  const width = left + Math.max(1, lanes.length - 1) * column + 120;
  const height = head + arrows.length * row + 10;
  const x = (l) => left + l * column;
  const parts = [`<svg viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="sequence diagram">`,
    "<defs>" + [["head", "#1c2833"], ["head-answer", "#2e86c1"], ["head-bad", "#c0392b"]].map(([id, fill]) =>
      `<marker id="${id}" viewBox="0 0 10 10" refX="10" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" markerHeight="9" orient="auto-start-reverse">` +
      `<path d="M 0 0 L 10 5 L 0 10 z" fill="${fill}"/></marker>`).join("") + "</defs>"];
  lanes.forEach((l, n) => {
    parts.push(`<text class="lane" data-lane="${n}" x="${x(n)}" y="16" text-anchor="middle">${escape(l.kind === "sluice" ? l.name : l.kind + " " + l.name)}</text>` +
               `<line class="life" x1="${x(n)}" y1="24" x2="${x(n)}" y2="${height}"/>`);
  });
  arrows.forEach((a, k) => {
    const y = head + k * row + 12;
    const bad = a.flags.some((f) => f !== "redacted" && f !== "gap" && f !== "filtered");
    const own = a.from === lanes.findIndex((l) => l.kind === "sluice") && a.dir === "B→C";
    const cls = ["arrow", a.dir === "B→C" ? "answer" : "", bad ? "bad" : "", own ? "own" : "",
                 String(state.selected) === String(a.i) ? "selected" : ""].join(" ");
    const x1 = x(a.from), x2 = x(a.to), mid = (x1 + x2) / 2;
    const topic = a.topic ? " " + a.topic.split("/").pop() : "";
    const after = a.latency !== null ? ` (${(1000 * a.latency).toFixed(2)} ms)` : "";
    const label = `${a.cmd}${topic}${after}${a.problem ? " — " + a.problem : ""}`;
    parts.push(`<g class="${cls}" data-frame="${escape(a.i)}" data-seq="${k}">` +
      `<title>#${escape(a.i)} ${escape(a.cmd)} on ${escape(a.name)} at ${a.t.toFixed(6)} s${a.problem ? ": " + escape(a.problem) : ""}</title>` +
      `<rect class="hit" x="0" y="${y - row / 2 - 4}" width="${width}" height="${row}"/>` +
      `<text class="time" x="4" y="${y + 3}">${a.t.toFixed(6)} s ${escape(a.name)}</text>` +
      `<line x1="${x1}" y1="${y}" x2="${x2}" y2="${y}" marker-end="url(#${bad ? "head-bad" : a.dir === "B→C" ? "head-answer" : "head"})"/>` +
      (a.via !== null ? `<circle cx="${x(a.via)}" cy="${y}" r="3" fill="#fff" stroke="#1c2833"/>` : "") +
      `<text x="${mid}" y="${y - 4}" text-anchor="middle">${escape(label)}</text></g>`);
  });
  parts.push("</svg>");
  let note = "";
  if (data.total > arrows.length) {
    note = `<p class="hint">frames ${escape(data.offset + 1)}–${escape(data.offset + arrows.length)} of ${escape(data.total)}: ` +
           "filter by a connection, producer or consumer to see one story whole.</p>";
  }
  $("sequence").innerHTML = parts.join("") + note;
  $("sequence-count").textContent = `(${arrows.length} of ${data.total} frames)`;
}

async function showDetail(i) {
  state.selected = i;
  markSelected();
  setFilter(currentFilter(), i);
  try {
    const d = await getDetail(i);
    const rows = [["frame", `#${escape(d.i)} ${escape(d.cmd)} ${escape(d.dir)}`], ["time", `${d.t.toFixed(6)} s (${escape(d.time)} UTC)`],
                  ["connection", escape(d.name)], ["topic", escape(d.topic)], ["size", `${escape(d.size)} bytes`],
                  ["file", escape(d.file)]];
    if (d.problem) rows.push(["problem", escape(d.problem)]);
    if (d.flags.length) rows.push(["marks", escape(d.flags.join(", "))]);
    if (d.pair !== null) rows.push([d.dir === "C→B" ? "answered by" : "answers",
      `<a href="#" data-frame="${escape(d.pair)}">#${escape(d.pair)}</a>` + (d.latency !== null ? ` after ${(1000 * d.latency).toFixed(3)} ms` : "")]);
    if (d.payload) rows.push(["payload", `${escape(d.payload.size)} bytes` + (d.payload.sha256 ? `, sha256 ${escape(d.payload.sha256)}` : "")]);
    let html = "<dl>" + rows.map(([k, v]) => `<dt>${k}</dt><dd>${v}</dd>`).join("") + "</dl>";
    html += `<h3>Command</h3><pre id="command">${escape(JSON.stringify(d.command, null, 2))}</pre>`;
    if (d.metadata) html += `<h3>Message metadata</h3><pre>${escape(JSON.stringify(d.metadata, null, 2))}</pre>`;
    if (d.payload && d.payload.text !== undefined) html += `<h3>Payload as text${d.payload.cut ? " (start)" : ""}</h3><pre>${escape(d.payload.text)}</pre>`;
    html += `<h3>Raw bytes (${escape(d.raw_size)}${d.raw_cut ? ", first 4096 shown" : ""})</h3><pre>${escape(d.raw_hex)}</pre>`;
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
    showSequence(await getSequence(filter, state.sequenceFrom));
  } catch (error) {
    $("problem").hidden = false;
    $("problem").textContent = error.message;
  }
  const frame = new URLSearchParams(location.hash.slice(1)).get("frame");
  if (frame !== null && String(state.selected) !== frame) showDetail(Number(frame));
}

// A live view (sluice view --live): the status every second, and unless
// paused the newest page of frames; "save" writes what the view holds.
async function followLive() {
  document.title = "Sluice live";
  document.querySelector("header h1").textContent = "Sluice live";
  $("live").hidden = false;
  let rounds = 0;
  for (;;) {
    await new Promise((r) => setTimeout(r, 1000));
    try {
      const status = await api("status");  // (also while paused: the view goes on watching)
      if (state.paused) continue;
      showStatus(status);
      const grew = status.frames !== state.seen;
      state.seen = status.frames;
      if (grew || rounds % 5 === 0) showConnections(await getConnections(), status.connections);
      if (grew) {
        const page = await getFrames(currentFilter(), 0);
        state.offset = Math.max(0, Math.floor((page.total - 1) / PAGE) * PAGE);
        state.sequenceFrom = Math.max(0, page.total - SEQUENCE);
        await refresh();
      }
      if (grew && rounds % 5 === 0) showSummary(await api("summary"));
      rounds += 1;
    } catch (error) {
      $("problem").hidden = false;
      $("problem").textContent = error.message;
    }
  }
}

$("pause").addEventListener("click", () => {
  state.paused = !state.paused;
  $("pause").textContent = state.paused ? "resume" : "pause";
  $("live").classList.toggle("paused", state.paused);
  $("live-note").textContent = state.paused ? "paused: new frames are kept, not shown" : "";
});

$("save").addEventListener("click", async () => {
  $("live-note").textContent = "saving…";
  try {
    const answer = await fetch("api/save", { method: "POST", headers: { "X-Sluice": "save" } });
    const data = await answer.json();
    if (!answer.ok) throw new Error(data.error || answer.statusText);
    $("live-note").textContent = `saved: ${data.path}`;
  } catch (error) {
    $("live-note").textContent = `not saved: ${error.message}`;
  }
});

async function start() {
  let status = DATA ? DATA.status : await api("status");
  showStatus(status);
  if (status.live) {
    showConnections(await getConnections(), status.connections);
    await refresh();
    showSummary(await api("summary"));
    state.status = status;
    return followLive();
  }
  showConnections(await getConnections(), status.connections);
  await refresh();
  // While the index is being built: keep the counts and the first page current.
  while (!DATA && status.building) {
    await new Promise((r) => setTimeout(r, 500));
    status = await api("status");
    showStatus(status);
    showConnections(await getConnections(), status.connections);
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
  state.sequenceFrom = 0;  // (a live view's last, for another filter's frames)
  setFilter(filter);
  refresh();
});
$("clear").addEventListener("click", () => { state.offset = state.sequenceFrom = 0; setFilter({}); refresh(); });
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); refresh(); });
$("next").addEventListener("click", () => { state.offset += PAGE; refresh(); });
document.addEventListener("click", (event) => {
  const target = event.target.closest("[data-frame]");
  if (target) { event.preventDefault(); showDetail(Number(target.dataset.frame)); }
  const conn = event.target.closest("tr[data-conn]");
  if (conn) { state.offset = state.sequenceFrom = 0; setFilter({ ...currentFilter(), conn: conn.dataset.conn }); refresh(); }
});
window.addEventListener("popstate", () => { state.offset = state.sequenceFrom = 0; refresh(); });
start().catch((error) => { $("problem").hidden = false; $("problem").textContent = error.message; });
