// The training view: polls training/data (same origin, the UI's cookie) and redraws. No library, no CDN: the API
// server may have no internet. Every value from the run goes in through textContent or an SVG attribute, never
// innerHTML: the log it comes from is the job's output, which is untrusted.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(window.location.search);
const POLL_S = Math.max(1, Number(params.get("poll") || 5));
const DATA_URL = "training/data?" + new URLSearchParams({ dag_id: params.get("dag_id") || "", run_id: params.get("run_id") || "" });
const STATE_COLORS = {
  success: "#38a169", failed: "#e53e3e", upstream_failed: "#ed8936", running: "#3182ce", deferred: "#805ad5",
  queued: "#a0aec0", scheduled: "#a0aec0", skipped: "#cbd5e0", up_for_retry: "#d69e2e", none: "#e2e8f0",
};

function el(tag, attrs, text) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function setText(id, text) { document.getElementById(id).textContent = text === null || text === undefined ? "-" : String(text); }

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}

function safeHttps(url) {
  try { const u = new URL(url); return u.protocol === "https:" ? u.href : null; } catch (e) { return null; }
}

// Each attempt after a node-loss recovery starts at a dashed line: "attempt N", with its rule and resumed step.
function drawAttempts(svg, attempts, sx, x0, x1, top, bottom) {
  for (const a of attempts || []) {
    if (a.at < x0 || a.at > x1) continue;
    const x = sx(Math.max(x0, a.at - 0.5)).toFixed(1);
    const line = el("svg:line", { class: "attempt", "data-attempt": a.attempt, x1: x, x2: x, y1: top, y2: bottom, stroke: "#dd6b20", "stroke-dasharray": "4 3" });
    line.appendChild(el("svg:title", {}, `attempt ${a.attempt}: resumed from step ${a.resumed_from ?? "?"}${a.rule ? ` after ${a.rule}` : ""}`));
    svg.appendChild(line);
    svg.appendChild(el("svg:text", { class: "attempt", x: Number(x) + 3, y: top + 18, fill: "#c05621" }, `attempt ${a.attempt}`));
  }
}

function drawCurve(curve, points, width = 360, height = 170, attempts = []) {
  const left = 46, right = 10, top = 8, bottom = 22;
  const box = el("div", { class: "curve" });
  box.appendChild(el("div", { class: "title" }, curve.title + (curve.unit ? ` (${curve.unit})` : "")));
  const svg = el("svg:svg", { viewBox: `0 0 ${width} ${height}`, "data-curve": curve.key, "data-points": points.length });
  svg.appendChild(el("svg:rect", { x: left, y: top, width: width - left - right, height: height - top - bottom, fill: "#f7fafc" }));
  if (points.length) {
    const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
    let y0 = Math.min(...ys), y1 = Math.max(...ys);
    // A bounded quantity (a score) keeps its whole range, so one run's dot sits where it is, not mid-chart.
    if (curve.range) { y0 = Math.min(y0, curve.range[0]); y1 = Math.max(y1, curve.range[1]); }
    if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
    const xLabel = curve.xLabel || "step";
    const sx = (x) => left + ((x - x0) / (x1 - x0)) * (width - left - right);
    const sy = (y) => top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom);
    drawAttempts(svg, attempts, sx, x0, x1, top, height - bottom);
    svg.appendChild(el("svg:polyline", { points: points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: "#3182ce", "stroke-width": 1.5 }));
    for (const p of points) {
      const dot = el("svg:circle", { class: "pt", cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 2, fill: "#2b6cb0" });
      dot.appendChild(el("svg:title", {}, p[2] || `${xLabel} ${p[0]}: ${p[1]}`));
      svg.appendChild(dot);
    }
    svg.appendChild(el("svg:text", { x: 2, y: top + 8 }, Number(y1.toPrecision(4))));
    svg.appendChild(el("svg:text", { x: 2, y: height - bottom }, Number(y0.toPrecision(4))));
    svg.appendChild(el("svg:text", { x: left, y: height - 6 }, `${xLabel} ${x0}`));
    svg.appendChild(el("svg:text", { x: width - right - 50, y: height - 6 }, `${xLabel} ${x1}`));
  } else {
    svg.appendChild(el("svg:text", { x: left + 10, y: height / 2 }, "no points yet"));
  }
  box.appendChild(svg);
  return box;
}

// The reward curve leads the page, beside the progress, cost and budget cards: as wide as the space left and as tall
// as the cards, so the whole lead row stays above the fold.
function drawReward(view) {
  const hero = document.getElementById("reward");
  const curve = view.curves.find((c) => c.key === "reward");
  const side = document.querySelector(".side");
  const width = Math.max(320, hero.clientWidth - 22), height = Math.max(180, side.offsetHeight - 34);
  const drawn = drawCurve(curve, view.series.reward || [], width, height, view.attempts);
  hero.replaceChildren(...drawn.childNodes);
}

function drawTimeline(stages) {
  const svg = document.getElementById("timeline");
  svg.replaceChildren();
  const rows = stages.filter((s) => s.offset_s !== null);
  const width = 760, row = 20, label = 90, end = Math.max(1, ...rows.map((s) => s.offset_s + (s.duration_s || 0)));
  svg.setAttribute("width", width);
  svg.setAttribute("height", Math.max(1, stages.length) * row + 16);
  stages.forEach((stage, i) => {
    const y = i * row;
    svg.appendChild(el("svg:text", { x: 0, y: y + 13 }, stage.name));
    if (stage.offset_s === null) {
      svg.appendChild(el("svg:text", { x: label, y: y + 13 }, `${stage.state} (not started)`));
      return;
    }
    const scale = (width - label - 140) / end;
    const x = label + stage.offset_s * scale, w = Math.max(2, (stage.duration_s || 0) * scale);
    const bar = el("svg:rect", { x: x.toFixed(1), y: y + 3, width: w.toFixed(1), height: row - 6, rx: 3, fill: STATE_COLORS[stage.state] || "#718096", "data-stage": stage.name, "data-state": stage.state });
    bar.appendChild(el("svg:title", {}, `${stage.name}: ${stage.state}, ${duration(stage.duration_s)} from +${duration(stage.offset_s)}`));
    svg.appendChild(bar);
    svg.appendChild(el("svg:text", { x: (x + w + 4).toFixed(1), y: y + 13 }, `${stage.state} ${duration(stage.duration_s)}`));
  });
  svg.appendChild(el("svg:text", { x: label, y: stages.length * row + 12 }, `0 to ${duration(end)} from the run's first task`));
}

function resourceRow(r) {
  const row = el("tr", { "data-task": r.task_id, class: r.state.startsWith("kept") ? "kept" : "" });
  const price = r.usd_per_hour === null ? "unknown" : r.usd_per_hour.toFixed(2);
  for (const cell of [r.kind, r.name, r.state, price, r.basis]) row.appendChild(el("td", {}, cell));
  row.lastChild.previousSibling.className = "num";
  return row;
}

// The costly resources one row each; the free ones (0 USD/h) in one line that opens to their rows.
function drawBanner(view) {
  const b = view.banner;
  const banner = document.getElementById("banner");
  banner.hidden = b.count === 0;
  const ended = ["success", "failed"].includes(view.run_state);
  banner.classList.toggle("ended", ended);
  const total = b.usd_per_hour ? `, about ${b.usd_per_hour.toFixed(2)} USD/h` : "";
  setText("banner-title", `${ended ? "Left running after the run" : "Running now"}: ${b.count} cloud resource(s)${total}`);
  document.getElementById("running").hidden = b.costly.length === 0;
  document.querySelector("#running tbody").replaceChildren(...b.costly.map(resourceRow));
  document.getElementById("free").hidden = b.free.length === 0;
  setText("free-line", b.free_line || "");
  document.querySelector("#free-rows tbody").replaceChildren(...b.free.map(resourceRow));
}

const BUDGET_LINES = [
  ["hours", "Hours", " h", (v) => v.toFixed(2)],
  ["usd", "USD", " USD", (v) => v.toFixed(2)],
  ["gpu_nodes", "GPU nodes", "", (v) => String(v)],
];

// Used and left of each limit; a limit nobody set says so.
function drawBudget(budget) {
  const body = document.getElementById("budget-rows");
  body.replaceChildren();
  const source = { "train.wait": "(published by train.wait)", settings: "(deployment settings)", none: "" };
  setText("budget-source", budget ? source[budget.source] || "" : "");
  for (const [key, label, unit, fmt] of BUDGET_LINES) {
    const line = budget ? budget[key] : null;
    const limited = line && line.limit !== null;
    const row = el("tr", { "data-budget": key, class: limited ? (line.over ? "over" : "") : "nolimit" });
    row.appendChild(el("td", { class: "what" }, label));
    const used = line && line.used !== null ? fmt(line.used) : "-";
    const verb = key === "gpu_nodes" ? "in use" : "used";
    const text = limited ? `${used} of ${fmt(line.limit)}${unit}, ${fmt(line.left)}${unit} left` : `${used}${unit} ${verb}, no limit set`;
    row.appendChild(el("td", { class: "amount" }, text));
    const meter = el("td", { class: "meter" });
    if (limited) {
      const bar = el("div", { class: line.over ? "bar over" : "bar" });
      const fill = el("div", {});
      fill.style.width = `${line.percent || 0}%`;
      bar.appendChild(fill);
      meter.appendChild(bar);
    }
    row.appendChild(meter);
    body.appendChild(row);
  }
  const stopped = budget && budget.stopped_at_budget;
  for (const id of ["budget-stop", "budget-line"]) document.getElementById(id).hidden = !stopped;
  setText("budget-stop", stopped ? "stopped at budget" : "");
  setText("budget-line", stopped ? budget.stopped_line : "");
}

function drawCheckpoints(list) {
  const body = document.querySelector("#checkpoints tbody");
  body.replaceChildren();
  document.getElementById("no-checkpoints").hidden = list.length > 0;
  for (const c of list) {
    const row = el("tr", { "data-step": c.step });
    row.appendChild(el("td", {}, c.step));
    row.appendChild(el("td", {}, c.lustre || "-"));
    row.appendChild(el("td", {}, c.exported || "not exported (yet)"));
    body.appendChild(row);
  }
}

// Where teardown copied the Ray session logs: the gs:// URI, linked to its Cloud Storage page, or why nothing was.
function drawRayLogs(logs) {
  const line = document.getElementById("ray-logs");
  line.hidden = !logs;
  if (!logs) return;
  const target = document.getElementById("ray-logs-link");
  target.replaceChildren();
  const url = logs.console_url && safeHttps(logs.console_url);
  if (url) target.appendChild(el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, logs.uri));
  target.appendChild(document.createTextNode(url ? ` ${logs.text.slice(logs.uri.length)}` : logs.text));
}

function drawPending(list) {
  const body = document.querySelector("#pending-checkpoints tbody");
  body.replaceChildren();
  document.getElementById("pending").hidden = list.length === 0;
  for (const c of list) {
    const row = el("tr", { "data-run": c.run });
    row.appendChild(el("td", {}, c.run));
    row.appendChild(el("td", {}, c.step));
    row.appendChild(el("td", {}, c.where));
    const release = el("td", {});
    release.appendChild(el("code", {}, c.release));
    row.appendChild(release);
    body.appendChild(row);
  }
}

// The model that came out: its score beside the base model's and the last published one's, the decision, and the
// DAG's score run by run (a nightly schedule's regression shows at a glance).
function drawModel(model) {
  const section = document.getElementById("model");
  section.hidden = !model;
  if (!model) return;
  const score = (v) => (v === null || v === undefined ? "-" : Number(v).toFixed(4));
  setText("model-hf", model.hf || "not exported");
  setText("model-eval", model.benchmark ? `${model.benchmark}, ${model.metric}, ${model.problems} problems` : "off");
  setText("model-score", score(model.score));
  setText("model-baseline", score(model.baseline));
  setText("model-published", score(model.published));
  setText("model-reason", model.reason || "-");
  const decision = document.getElementById("model-decision");
  decision.textContent = model.decision || "";
  decision.className = "decision " + (model.decision || "");
  const runs = model.history.map((h, i) => [i + 1, h.score, `${h.run_id}: ${score(h.score)} (${h.outcome || "-"})`]);
  const curve = { key: "score-by-run", title: "Score by run (this DAG's runs, oldest first)", unit: "", xLabel: "run",
    range: [0, 1] };
  const chart = drawCurve(curve, runs, 720, 170);
  document.getElementById("model-history").replaceChildren(chart);
}

function render(view) {
  const state = document.getElementById("run-state");
  state.textContent = view.run_state;
  state.className = "state " + view.run_state;
  setText("run-id", `${view.dag_id} / ${view.run_id}`);
  setText("spec", view.spec ? `${view.spec.mode}, recipe ${view.spec.recipe}, ${view.spec.gpu}, ${view.spec.max_steps} steps, teardown ${view.spec.teardown_policy}, ${view.spec.project} / ${view.spec.zone}` : "conf not validated yet");
  const p = view.progress;
  setText("step", p.step ? `step ${p.step} of ${p.total_steps}` : p.state === "none" ? "not started" : p.state);
  setText("percent", p.percent !== null ? `${p.completed} done (${p.percent}%)` : "");
  document.getElementById("bar-fill").style.width = `${p.percent || 0}%`;
  setText("eta", p.eta_s !== null ? `ETA ${duration(p.eta_s)}, at ${p.eta_at.slice(11)} · train.wait ${p.state}` : `train.wait ${p.state}`);
  setText("steps-parsed", view.points);
  setText("step-time", p.mean_step_time_s !== null ? `, ${p.mean_step_time_s} s a step lately` : "");
  if (view.cost) {
    setText("node-hours", view.cost.gpu_node_hours);
    setText("gpu-hours", `${view.cost.gpu_hours} GPU-hours of ${view.cost.gpu_type}`);
    setText("cost", view.cost.estimated_cost_usd === null ? "unknown" : `${view.cost.estimated_cost_usd.toFixed(2)} USD`);
    setText("price", `${view.cost.price_per_gpu_hour_usd} USD per GPU-hour (${view.cost.price_source})${view.cost.pool_still_running ? ", GPU pool still up" : ""}`);
    const tried = view.cost.rungs.map((r) => `${r.capacity}: ${r.outcome}`).join(", ");
    setText("capacity", view.cost.rungs.length > 1 ? `GPU capacity ${view.cost.capacity} (ladder: ${tried})` : "");
  }
  const ended = ["success", "failed"].includes(view.run_state);
  const rate = view.banner.usd_per_hour;
  setText("rate", rate ? `+ about ${rate.toFixed(2)} USD/h ${ended ? "left running" : "now"}` : "");
  drawBudget(view.budget);
  drawBanner(view);
  drawReward(view);
  drawTimeline(view.stages);
  const curves = document.getElementById("curves");
  const rest = view.curves.filter((c) => c.key !== "reward");
  curves.replaceChildren(...rest.map((c) => drawCurve(c, view.series[c.key] || [], 360, 170, view.attempts)));
  curves.setAttribute("data-points", view.points);
  const wandb = document.getElementById("wandb");
  wandb.replaceChildren();
  const url = view.wandb_url && safeHttps(view.wandb_url);
  if (url) wandb.appendChild(el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, "W&B run"));
  drawModel(view.model);
  drawCheckpoints(view.checkpoints);
  drawPending(view.pending_checkpoints || []);
  drawRayLogs(view.ray_logs || null);
  setText("updated", view.generated_at);
  document.body.setAttribute("data-points", view.points);
  document.body.setAttribute("data-run-state", view.run_state);
  document.body.setAttribute("data-wait-state", p.state);
}

// The curves held from the polls so far, and the token the server gave with them: it then sends only the points
// after the step the token names (series_window.from), and every point when "from" is 0.
let held = { series: {}, token: "" };

function withHeldSeries(view) {
  const window_ = view.series_window || { from: 0, token: "" };
  const series = {};
  for (const [key, points] of Object.entries(view.series || {})) {
    const before = window_.from > 0 ? (held.series[key] || []).filter((p) => p[0] <= window_.from) : [];
    series[key] = before.concat(points);
  }
  held = { series, token: window_.token || "" };
  return { ...view, series };
}

async function poll() {
  try {
    const url = held.token ? `${DATA_URL}&${new URLSearchParams({ since: held.token })}` : DATA_URL;
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status} from ${url}`);
    render(withHeldSeries(await response.json()));
    setText("error", "");
    delete document.body.dataset.error;
  } catch (error) {
    // A render that threw leaves the page half redrawn: the footer says why, and so does the body for the tests.
    setText("error", String(error));
    document.body.dataset.error = `${error}${error && error.stack ? "\n" + error.stack : ""}`;
  }
  // Keep polling after the run ended too: its teardown and report still change what the banner shows.
  window.setTimeout(poll, POLL_S * 1000);
}

setText("every", POLL_S);
poll();
