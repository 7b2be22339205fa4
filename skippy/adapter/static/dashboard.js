// skippy's live pipeline page: polls /dashboard/data and turns counters into rates between two polls.
// No dependencies, no build step. ?interval=MS sets the poll period (default 1000 ms).
"use strict";

const HISTORY = 120;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const params = new URLSearchParams(window.location.search);
const interval = Math.max(100, Number(params.get("interval")) || 1000);
const history = { util: {}, toks: [], inFlight: [], queue: [], prefill: {} };
let previous = null;
let updates = 0;

function $(id) { return document.getElementById(id); }

function fmt(value, digits) {
  if (value === null || value === undefined || !isFinite(value)) return "–";
  return value.toFixed(digits);
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function push(series, value) {
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

// mean of (sum, count) over the requests that finished between two polls
function windowMean(now, before, sumKey, countKey) {
  const count = now[countKey] - (before ? before[countKey] : 0);
  if (count <= 0) return null;
  return (now[sumKey] - (before ? before[sumKey] : 0)) / count;
}

// draft tokens accepted / proposed since the last poll (else overall); the driver's counts, else the adapter's
function acceptRate(data) {
  const fromDriver = Boolean(data.driver && data.driver.spec_proposed > 0);
  const pick = (x) => (x && (fromDriver ? x.driver : x.adapter)) || { spec_proposed: 0, spec_accepted: 0 };
  const now = pick(data), before = pick(previous);
  const proposed = now.spec_proposed - before.spec_proposed;
  if (proposed > 0) return (now.spec_accepted - before.spec_accepted) / proposed;
  return now.spec_proposed > 0 ? now.spec_accepted / now.spec_proposed : null;
}

function drawChart(canvas, series, fixedMax) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height, pad = 28;
  ctx.clearRect(0, 0, w, h);
  let max = fixedMax || 0;
  for (const s of series) for (const v of s.values) max = Math.max(max, v);
  if (max <= 0) max = 1;
  ctx.strokeStyle = "#ccc"; ctx.fillStyle = "#666"; ctx.font = "10px sans-serif"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i += 1) {
    const y = h - pad / 2 - (i / 4) * (h - pad);
    ctx.beginPath(); ctx.moveTo(pad, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(fixedMax === 1 ? `${i * 25}%` : (max * i / 4).toFixed(max < 4 ? 2 : max < 10 ? 1 : 0), 2, y + 3);
  }
  for (const s of series) {
    ctx.strokeStyle = s.color; ctx.lineWidth = 2; ctx.beginPath();
    s.values.forEach((v, i) => {
      const x = pad + (i / (HISTORY - 1)) * (w - pad - 4);
      const y = h - pad / 2 - (v / max) * (h - pad);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

function legend(element, series) {
  element.innerHTML = series.map((s) => `<span style="--c:${s.color}">${s.name}</span>`).join("");
}

// prompt tokens / the stage's compute on the batches that carried them, between two polls; the last such
// window's rate stays shown while no prompt runs (prefill comes in bursts)
function prefillRate(id, s, before) {
  const seconds = before ? s.prefill_compute_seconds - before.prefill_compute_seconds : 0;
  if (seconds > 0) history.prefill[id] = (s.prefill_tokens - before.prefill_tokens) / seconds;
  return history.prefill[id];
}

function renderStages(data, dt) {
  const body = $("stages").querySelector("tbody");
  const rows = [];
  Object.keys(data.stages).forEach((id, i) => {
    const s = data.stages[id];
    const before = previous && previous.stages[id];
    const util = before && dt > 0 ? Math.min(1, Math.max(0, (s.compute_seconds - before.compute_seconds) / dt)) : 0;
    if (!history.util[id]) history.util[id] = [];
    push(history.util[id], util);
    const scraped = s.scraped > 0;
    const perBatch = scraped && s.batches > 0 ? s.rows / s.batches : null;
    rows.push(`<tr><td style="color:${COLORS[i % COLORS.length]}">${id}</td><td id="stage-${id}-util">${fmt(util * 100, 1)}%</td>`
      + `<td id="stage-${id}-prefill">${fmt(prefillRate(id, s, before), 1)}</td>`
      + `<td>${scraped ? s.batches : "–"}</td><td>${fmt(perBatch, 1)}</td><td>${scraped ? s.queue_depth : "–"}</td>`
      + `<td>${scraped ? s.kv_cells : "–"}</td><td>${scraped ? s.sessions : "–"}</td>`
      + `<td>${scraped ? bytes(s.bytes_in) : "–"}</td><td>${scraped ? bytes(s.bytes_out) : "–"}</td>`
      + `<td>${scraped ? fmt(s.credit_wait_seconds, 3) : "–"}</td></tr>`);
  });
  body.innerHTML = rows.join("");
  const series = Object.keys(history.util).map((id, i) => ({ name: id, color: COLORS[i % COLORS.length], values: history.util[id] }));
  drawChart($("chart-util"), series, 1);
  legend($("legend-util"), series);
}

function renderProcesses(data) {
  $("processes").querySelector("tbody").innerHTML = data.processes.map((p) =>
    `<tr><td>${p.process}</td><td>${p.url}</td><td class="${p.up ? "" : "down"}">${p.up ? "up" : "not answering"}</td></tr>`).join("");
}

function text(value) {
  const span = document.createElement("span");
  span.textContent = value === null || value === undefined ? "" : String(value);
  return span.innerHTML;
}

// SSH hosts (the run's record): state, stages, why a host was dropped; hidden without hosts
function renderHosts(record) {
  const hosts = (record && record.hosts) || [];
  $("hosts-section").hidden = hosts.length === 0;
  $("replans").textContent = record && record.replans ? record.replans : 0;
  $("hosts-failed").textContent = record && record.failed ? record.failed : "";
  $("hosts").querySelector("tbody").innerHTML = hosts.map((h) =>
    `<tr id="host-${text(h.name)}"><td>${text(h.name)}</td><td>${text(h.address)}</td>`
    + `<td class="${h.state === "dropped" ? "down" : ""}">${text(h.state)}</td>`
    + `<td>${text((h.stages || []).join(", "))}</td><td>${text(h.reason)}</td></tr>`).join("");
}

function renderWire(wire) {
  // the format stage 0 certified at startup: the one used, what was asked, each tried format's argmax agreement
  if (!wire) return;
  $("wire").textContent = wire.used;
  const tried = Object.entries(wire.agreement).map(([dtype, a]) => `${dtype} ${fmt(a, 2)}`).join(" · ");
  $("wire-detail").textContent = `asked ${wire.asked}${wire.certified === "true" ? "" : " (uncertified)"}${tried ? ` · ${tried}` : ""}`;
}

// the policy's current k and alpha per running session; acceptance per draft position since startup
function renderSpeculation(spec) {
  if (!spec) return;
  const perPos = spec.drafts > 0 ? spec.accepted_per_pos.map((n, i) => `${i}: ${fmt(100 * n / spec.drafts, 0)}%`) : [];
  $("spec-per-pos").textContent = perPos.length ? perPos.join(" · ") : "–";
  const body = $("spec-sessions").querySelector("tbody");
  body.replaceChildren(...spec.sessions.map((s) => {
    const row = document.createElement("tr");
    for (const text of [s.session, String(s.k), fmt(s.alpha, 2)]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.appendChild(cell);
    }
    return row;
  }));
}

function render(data) {
  const dt = previous ? data.time - previous.time : 0;
  const a = data.adapter, pa = previous && previous.adapter;
  const toks = pa && dt > 0 ? Math.max(0, (a.completion_tokens - pa.completion_tokens) / dt) : 0;
  const ttft = windowMean(a, pa, "ttft_sum", "ttft_count");
  const tpot = windowMean(a, pa, "tpot_sum", "tpot_count");
  const d = data.driver;
  const accept = acceptRate(data);
  const queue = data.broker ? data.broker.queue_depth : data.pipeline.waiting;
  $("tok-s").textContent = fmt(toks, 1);
  if (ttft !== null) $("ttft-ms").textContent = fmt(ttft * 1000, 1);
  if (tpot !== null) $("tpot-ms").textContent = fmt(tpot * 1000, 2);
  $("in-flight").textContent = d ? `${d.in_flight} / ${d.in_flight_limit}` : "–";
  $("queue-depth").textContent = String(queue);
  $("running").textContent = String(data.pipeline.running);
  $("accept-rate").textContent = accept === null ? "–" : `${fmt(100 * accept, 1)}%`;
  $("requests-total").textContent = String(a.requests);
  $("completion-tokens").textContent = String(a.completion_tokens);
  $("dropped").textContent = String(data.telemetry.dropped);
  renderWire(data.wire);
  renderSpeculation(data.speculation);
  push(history.toks, toks);
  push(history.inFlight, d ? d.in_flight : 0);
  push(history.queue, queue);
  drawChart($("chart-toks"), [{ name: "tok/s", color: COLORS[0], values: history.toks }]);
  const depth = [{ name: "in flight", color: COLORS[2], values: history.inFlight }, { name: "queue depth", color: COLORS[3], values: history.queue }];
  drawChart($("chart-depth"), depth);
  legend($("legend-depth"), depth);
  renderStages(data, dt);
  renderProcesses(data);
  renderHosts(data.hosts);
  previous = data;
}

async function poll() {
  try {
    const response = await fetch("/dashboard/data", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    updates += 1;
    $("updates").textContent = String(updates);
    $("status").textContent = "live";
    $("status").className = "status ok";
  } catch (error) {
    $("status").textContent = `not answering (${error.message})`;
    $("status").className = "status error";
  }
  window.setTimeout(poll, interval);
}

poll();
