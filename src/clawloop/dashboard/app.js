// clawloop's dashboard. Plain JavaScript, no dependencies, no build step: it reads only
// clawloop's own JSON API (/api/*, listed in gateway/dashboard.py) and draws its charts
// itself as SVG. Views, by URL hash:
//   #/               serving figures, sessions (paged, newest first), judge and trainer charts
//   #/session/<id>   one session's turns: prompt, answer, next state, verdict, training state
//   #/results        learning curves posted by `clawloop demo` / `clawloop eval`
//   #/buffer         the rollout buffer's tasks and groups (`clawloop up --buffer URL`)
"use strict";

const KEY = "clawloop.apiKey";   // sessionStorage: the tab forgets it when closed
const REFRESH_MS = 3000;
const PAGE = 20;        // sessions per page
const TURNS = 100;      // turns per page of a session
const COLORS = ["#2f6fdf", "#e0662f", "#2a9d5c", "#9b59b6", "#c0392b", "#6b7785"];
const SCORE = { pos: "#2a9d5c", zero: "#a3abb5", neg: "#d64545" };

const S = {
  hist: { t: [], series: {} }, startedAt: null, offset: 0, sessions: null, session: null, turnOffset: 0,
  verdicts: null, results: null, resultIdx: 0, buffer: null, tick: 0, timer: null, shown: "",
};

class NeedKey extends Error {}

// ---- DOM: text always goes in as text nodes, never as HTML (prompts are user content) ----
function h(tag, attrs, ...kids) { return fill(document.createElement(tag), attrs, kids); }
function sv(tag, attrs, ...kids) { return fill(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, kids); }

function fill(e, attrs, kids) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const k of kids.flat(Infinity)) {
    if (k !== null && k !== undefined && k !== false) e.append(k instanceof Node ? k : String(k));
  }
  return e;
}

function swatch(color) {
  const i = h("i", { class: "swatch" });
  i.style.backgroundColor = color;   // CSSOM, allowed by the page's CSP (style attributes are not)
  return i;
}

// ---- formatting ----
function num(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (Number.isInteger(v)) return v.toLocaleString("en-US");
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
  return String(+v.toPrecision(digits));
}
function secs(v) {
  if (v === null || v === undefined) return "–";
  return v < 1 ? `${Math.round(v * 1000)} ms` : `${num(v)} s`;
}
function pad(n) { return String(n).padStart(2, "0"); }
function clock(t) {
  const d = new Date(t * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function stamp(t) {
  if (!t) return "–";
  const d = new Date(t * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(t)}`;
}
function ago(t) {
  if (!t) return "–";
  const s = Math.max(0, Date.now() / 1000 - t);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}
function signed(v) { return v > 0 ? `+${num(v)}` : v < 0 ? `−${num(-v)}` : "0"; }

// ---- the API ----
async function api(path) {
  const headers = {};
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = "Bearer " + key;
  const r = await fetch("api/" + path, { cache: "no-store", headers });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  const msg = body && body.error ? body.error.message : `HTTP ${r.status}`;
  if (r.status === 401) {
    askKey(key ? "That key was refused (" + msg + ") Try another." : "This server has API keys: enter yours to see it.");
    throw new NeedKey(msg);
  }
  if (!r.ok) throw new Error(msg);
  return body;
}

function askKey(why) {
  sessionStorage.removeItem(KEY);
  document.getElementById("login-why").textContent = why;
  document.getElementById("login").hidden = false;
  document.getElementById("login-key").focus();
}

// ---- the metrics history: incremental, reset when the server restarts ----
async function loadHistory() {
  const last = S.hist.t.length ? S.hist.t[S.hist.t.length - 1] : 0;
  const d = await api("history?since=" + last);
  for (const k of d.keys) {
    if (!S.hist.series[k]) S.hist.series[k] = new Array(S.hist.t.length).fill(null);
  }
  for (let i = 0; i < d.t.length; i++) {
    S.hist.t.push(d.t[i]);
    for (const k of d.keys) S.hist.series[k].push(d.series[k][i]);
  }
  const cap = 2000;   // the server keeps an hour; so does the page
  if (S.hist.t.length > cap) {
    const cut = S.hist.t.length - cap;
    S.hist.t.splice(0, cut);
    for (const k of Object.keys(S.hist.series)) S.hist.series[k].splice(0, cut);
  }
}

function raw(key) {
  const v = S.hist.series[key] || [];
  const out = [];
  for (let i = 0; i < S.hist.t.length; i++) if (v[i] !== null && v[i] !== undefined) out.push([S.hist.t[i], v[i]]);
  return out;
}
function rate(key) {     // per second, between consecutive samples
  const p = raw(key), out = [];
  for (let i = 1; i < p.length; i++) {
    const dt = p[i][0] - p[i - 1][0], dv = p[i][1] - p[i - 1][1];
    if (dt > 0 && dv >= 0) out.push([p[i][0], dv / dt]);
  }
  return out;
}
function perStep(key) {  // the value at each sample where the trainer's step count moved
  const v = S.hist.series[key] || [], steps = S.hist.series["train/steps"] || [], out = [];
  for (let i = 0; i < S.hist.t.length; i++) {
    if (v[i] === null || v[i] === undefined || !steps[i]) continue;
    if (!out.length || steps[i] !== steps[i - 1]) out.push([S.hist.t[i], v[i]]);
  }
  return out;
}
function meanLatency() {
  const sum = S.hist.series["serve/latency_sum_s"] || [], n = S.hist.series["serve/ok_requests"] || [], out = [];
  for (let i = 1; i < S.hist.t.length; i++) {
    const dn = n[i] - n[i - 1];
    if (dn > 0) out.push([S.hist.t[i], (sum[i] - sum[i - 1]) / dn]);
  }
  return out;
}
function errorRate() {
  const a = rate("serve/errors_4xx"), b = rate("serve/errors_5xx");
  return a.map((p, i) => [p[0], p[1] + (b[i] ? b[i][1] : 0)]);
}

// ---- charts (SVG) ----
function ticks(lo, hi, n) {
  if (lo === hi) { lo -= lo === 0 ? 1 : Math.abs(lo) * 0.5; hi += hi === 0 ? 1 : Math.abs(hi) * 0.5; }
  const raw0 = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw0)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw0);
  const k0 = Math.floor(lo / step), k1 = Math.ceil(hi / step), out = [];
  for (let k = k0; k <= k1; k++) out.push(+(k * step).toPrecision(12));   // k * step: 0 is exactly 0
  const a = out[0], b = out[out.length - 1];
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9) + (step / mag === 2.5 ? 1 : 0));
  const fmt = v => Math.abs(v) >= 1e5 || (step < 1e-4 && v !== 0) ? v.toExponential(1) : v.toFixed(decimals);
  return { lo: a, hi: b, ticks: out, fmt };
}

// series: [{name, color, pts: [[x, y]], dash, dots}]; bars: [{x, w, parts: [{v, color}]}]; x: "time" | "num";
// xmin / xmax widen the x range (a fixed window); zero: the y range includes 0; W x H: the drawing's size
// in its own units, close to the pixels it gets, so its text keeps the page's size.
function plot({ series = [], bars = null, x = "time", zero = false, xmin = null, xmax = null, W = 320, H = 150 }) {
  const L = 44, R = 10, T = 8, B = 22;
  const xs = [], ys = [];
  for (const se of series) for (const [a, b] of se.pts) { xs.push(a); ys.push(b); }
  for (const b of bars || []) {
    xs.push(b.x, b.x + b.w);
    ys.push(0, b.parts.reduce((s, p) => s + p.v, 0));
  }
  if (!xs.length) return null;
  if (xmin !== null) xs.push(xmin);
  if (xmax !== null) xs.push(xmax);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x0 === x1) { x0 -= x === "time" ? 30 : 1; x1 += x === "time" ? 30 : 1; }
  if (zero) ys.push(0);
  const yt = ticks(Math.min(...ys), Math.max(...ys), 4);
  const px = v => L + (v - x0) / (x1 - x0) * (W - L - R);
  const py = v => T + (1 - (v - yt.lo) / (yt.hi - yt.lo)) * (H - T - B);
  const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
  for (const v of yt.ticks) {
    svg.append(sv("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), class: v === 0 ? "axis" : "grid" }),
      sv("text", { x: L - 5, y: py(v) + 3.5, class: "ytick" }, yt.fmt(v)));
  }
  const xt = x === "time" ? [0, 0.5, 1].map(f => x0 + f * (x1 - x0))
    : ticks(x0, x1, 4).ticks.filter(v => v >= x0 && v <= x1 && Number.isInteger(v));
  for (const v of xt) {  // the end labels stay inside the frame
    const anchor = px(v) < L + 25 ? "start" : px(v) > W - R - 25 ? "end" : "middle";
    svg.append(sv("text", { x: px(v), y: H - 6, class: "xtick", "text-anchor": anchor }, x === "time" ? clock(v) : num(v)));
  }
  for (const b of bars || []) {
    let base = 0;
    const w = Math.max(1.5, px(b.x + b.w) - px(b.x) - 1);
    for (const p of b.parts) {
      if (p.v > 0) svg.append(sv("rect", { x: px(b.x), y: py(base + p.v), width: w, height: py(base) - py(base + p.v), fill: p.color }));
      base += p.v;
    }
  }
  for (const se of series) {
    if (!se.pts.length) continue;
    if (se.pts.length === 1) {
      svg.append(sv("circle", { cx: px(se.pts[0][0]), cy: py(se.pts[0][1]), r: 2.5, fill: se.color }));
      continue;
    }
    const d = se.pts.map(([a, b], i) => `${i ? "L" : "M"}${px(a).toFixed(1)},${py(b).toFixed(1)}`).join("");
    svg.append(sv("path", { d, stroke: se.color, class: se.dash ? "line dash" : "line" }));
    if (se.dots) for (const [a, b] of se.pts) svg.append(sv("circle", { cx: px(a), cy: py(b), r: 2, fill: se.color }));
  }
  return svg;
}

function chart(title, opts, empty) {
  const svg = plot(opts);
  const legend = (opts.series || []).filter(se => se.name).map(se => {
    const last = se.pts.length ? se.pts[se.pts.length - 1][1] : null;
    return h("span", {}, swatch(se.color), `${se.name} `, h("b", {}, se.fmt ? se.fmt(last) : num(last)));
  });
  return h("div", { class: "chart" }, h("h3", {}, title),
    svg || h("div", { class: "empty" }, empty || "no data yet"),
    h("div", { class: "legend" }, legend, opts.legend || []));
}

function line(name, pts, i, extra) { return Object.assign({ name, pts, color: COLORS[i % COLORS.length] }, extra || {}); }

// ---- views ----
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  if (hash.startsWith("session/")) return { name: "session", id: decodeURIComponent(hash.slice(8)) };
  if (hash === "results") return { name: "results" };
  if (hash === "buffer") return { name: "buffer" };
  return { name: "overview" };
}

function renderHeader(st) {
  document.getElementById("model").textContent = "model " + st.model;
  const v = document.getElementById("policy-version");
  v.textContent = "v" + st.policy_version;
  v.dataset.version = st.policy_version;
  const hl = document.getElementById("health");
  hl.textContent = st.health.status;
  hl.className = "health " + st.health.status;
  document.getElementById("forget-key").hidden = !sessionStorage.getItem(KEY);
}

function card(label, value, sub, id) {
  return h("div", { class: "card", id }, h("div", { class: "label" }, label), h("div", { class: "value" }, value),
    h("div", { class: "sub" }, sub));
}

function renderCards(st) {
  const sv_ = st.serving, x = st.stats, rps = rate("gateway/requests");
  const judging = x["judge/judged"] !== undefined, training = x["train/steps"] !== undefined;
  const cards = [
    card("policy version", "v" + st.policy_version, `${num(x["engine/publishes"] ?? 0)} publishes`, "card-version"),
    card("requests", num(sv_.requests), rps.length ? `${num(rps[rps.length - 1][1])} /s now` : "since start"),
    card("errors", `${num(sv_.errors_4xx)} · ${num(sv_.errors_5xx)}`, `4xx · 5xx, ${num(sv_.timeouts)} timeouts`),
    card("latency", secs(sv_.latency.mean_s), sv_.latency.count ? `mean · p50 ≤ ${secs(sv_.latency.p50_s)} · p95 ≤ ${secs(sv_.latency.p95_s)}`
      : "no answered request yet"),
    card("in flight", num(sv_.inflight), `${num(sv_.queued)} queued · ${num(sv_.slots_used)}/${num(sv_.capacity)} slots`),
    card("sessions", num(x["capture/open_sessions"] ?? 0) + " open", `${num(x["capture/turns_captured"] ?? 0)} turns captured`),
    card("judge", judging ? num(x["judge/judged"]) + " judged" : st.judge,
      judging ? `${num(x["judge/pending"])} pending · ${signed(x["judge/score_pos"])} / ${num(x["judge/score_zero"])} / −${num(x["judge/score_neg"])}`
        : "not running in this process"),
    card("trainer", training ? num(x["train/steps"]) + " steps" : st.train.method,
      training ? `loss ${num(x["train/loss"])} · cursor ${num(st.train.cursor)}` : "not running in this process"),
  ];
  if (x["gate/size"] !== undefined) cards.push(gateCard(x));
  document.getElementById("cards").replaceChildren(...cards);
}

function gateCard(x) {   // the trainer's publish gate (trainer/gate.py): last candidate, score vs baseline, refusals
  if (!x["gate/size"]) return card("publish gate", "unchecked", "nothing to check: pass --regression-set FILE", "card-gate");
  const base = `baseline ${num(x["gate/baseline"])} ± ${num(x["gate/tolerance"])}`;
  if (x["gate/last_checked_version"] === undefined)
    return card("publish gate", `${num(x["gate/size"])} checks`, `${base} · no candidate yet`, "card-gate");
  const passed = x["gate/last_passed"] === 1;
  // the tolerance applies per group: show the group that lost most against its baseline
  const groups = Object.keys(x).filter(k => k.startsWith("gate/score/")).map(k => k.slice("gate/score/".length));
  const drop = g => (x["gate/baseline/" + g] ?? 0) - x["gate/score/" + g];
  const worst = groups.reduce((a, g) => (a === null || drop(g) > drop(a) ? g : a), null);
  const scored = worst === null ? `score ${num(x["gate/score"])} vs ${base}`
    : `${worst} ${num(x["gate/score/" + worst])} vs baseline ${num(x["gate/baseline/" + worst])} ± ${num(x["gate/tolerance"])}`;
  const c = card("publish gate", `v${x["gate/last_checked_version"]} ${passed ? "passed" : "refused"}`,
    `${scored} · ${num(x["gate/refused"])} of ${num(x["gate/candidates"])} refused` +
    (x["gate/fallbacks"] ? ` · ${num(x["gate/fallbacks"])} fell back` : "") +
    (x["gate/recovered"] ? ` · ${num(x["gate/recovered"])} recovered` : "") +
    (x["gate/near_served"] ? ` · ${num(x["gate/near_served"])} near served` : "") + ` · ${secs(x["gate/last_check_s"])}`,
    "card-gate");
  c.classList.add(passed ? "gate-passed" : "gate-refused");
  return c;
}

function verdictChips(r) {   // how many +1, 0 and −1 verdicts
  return h("span", { class: "chips" },
    h("span", { class: "chip pos", title: "+1 verdicts" }, num(r.score_pos)),
    h("span", { class: "chip zero", title: "0 verdicts" }, num(r.score_zero)),
    h("span", { class: "chip neg", title: "−1 verdicts" }, num(r.score_neg)),
    h("span", { class: "muted" }, ` of ${r.main_turns} main`));
}

function renderSessions(d) {
  const rows = d.data.map(r => h("tr", { class: "row", onclick: () => { location.hash = "#/session/" + encodeURIComponent(r.session_id); } },
    h("td", {}, h("a", { href: "#/session/" + encodeURIComponent(r.session_id), class: "sid" }, r.session_id),
      r.tenant ? h("span", { class: "muted" }, " " + r.tenant) : null),
    h("td", { class: "n" }, num(r.turns)),
    h("td", { title: stamp(r.last_seen) }, ago(r.last_seen)),
    h("td", {}, r.closed ? h("span", { class: "tag closed", title: "closed " + stamp(r.closed_at) }, r.closed_reason || "closed")
      : h("span", { class: "tag open" }, "open")),
    h("td", {}, verdictChips(r)),
    h("td", { class: "n" }, r.last_version === null ? "–" : "v" + r.last_version)));
  const from = d.total ? d.offset + 1 : 0, to = d.offset + d.data.length;
  const pager = h("div", { class: "pager" },
    h("button", { type: "button", disabled: d.offset === 0, onclick: () => { S.offset = Math.max(0, S.offset - PAGE); refreshNow(); } }, "‹ newer"),
    h("span", {}, `${from}–${to} of ${num(d.total)}`),
    h("button", { type: "button", disabled: to >= d.total, onclick: () => { S.offset += PAGE; refreshNow(); } }, "older ›"));
  return h("section", { class: "panel sessions" },
    h("h2", {}, "Sessions", h("span", { class: "muted" }, ` verdicts by ${d.judge}`)),
    d.data.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "session"), h("th", { class: "n" }, "turns"), h("th", {}, "last activity"),
      h("th", {}, "state"), h("th", {}, "verdicts +1 · 0 · −1"), h("th", { class: "n" }, "version"))),
      h("tbody", {}, rows)) : h("div", { class: "empty" }, "No sessions yet: send a chat request with an X-Session-Id header."),
    pager);
}

function renderCharts() {
  const v = S.verdicts;
  const bars = v ? v.data.map(b => ({ x: b.t, w: v.bucket_s, parts: [{ v: b.pos, color: SCORE.pos }, { v: b.zero, color: SCORE.zero }, { v: b.neg, color: SCORE.neg }] })) : [];
  const tot = k => v ? v.data.reduce((s, b) => s + b[k], 0) : 0;
  const verdictLegend = [h("span", {}, swatch(SCORE.pos), "+1 ", h("b", {}, num(tot("pos")))), h("span", {}, swatch(SCORE.zero), "0 ", h("b", {}, num(tot("zero")))),
    h("span", {}, swatch(SCORE.neg), "−1 ", h("b", {}, num(tot("neg"))))];
  const charts = [
    chart("Requests / s", { series: [line("requests", rate("gateway/requests"), 0), line("errors", errorRate(), 4)], zero: true }),
    chart("Latency (mean per interval)", { series: [line("latency", meanLatency(), 1, { fmt: secs })], zero: true }),
    chart(`Judge verdicts per ${v ? num(v.bucket_s) : "–"} s (last hour)`,
      { bars, zero: true, legend: verdictLegend, xmax: v ? v.now : null, xmin: v ? v.now - 10 * v.bucket_s : null },
      "no verdicts in the last hour"),
    chart("Train loss (per step)", { series: [line("loss", perStep("train/loss"), 0, { dots: true }), line("pg loss", perStep("train/pg_loss"), 1, { dots: true })] },
      "no training step yet"),
    chart("Advantages and rewards", { series: [line("score mean", perStep("train/score_mean"), 2, { dots: true }),
      line("combine adv", perStep("train/combine_adv_mean"), 0, { dots: true }),
      line("judge reward (window)", raw("judge/window_reward_mean"), 5, { dash: true })], zero: true }, "no judge or trainer figures yet"),
    chart("Drift: KL to the base weights and entropy (per step)", { series: [line("KL to base", perStep("train/kl"), 4, { dots: true }),
      line("entropy", perStep("train/entropy"), 1, { dots: true }), line("anchor KL", perStep("train/anchor_kl"), 2, { dots: true })], zero: true },
      "no training step yet"),
    chart("Steps and policy version", { series: [line("train steps", raw("train/steps"), 0), line("policy version", raw("engine/policy_version"), 1)], zero: true }),
    chart("Publishing (stall per publish)", { series: [line("trainer publish", raw("train/last_publish_s"), 0, { fmt: secs }),
      line("engine swap", raw("engine/last_publish_s"), 1, { fmt: secs })], zero: true,
      legend: [["failed", "train/publish_failures"], ["stale batches dropped", "train/stale_dropped"], ["refused by the gate", "gate/refused"]].map(([label, key]) => {
        const p = raw(key);
        return p.length ? h("span", {}, `${label} `, h("b", {}, num(p[p.length - 1][1]))) : null;
      }) }, "no publish yet"),
    chart("Queue", { series: [line("in flight", raw("gateway/inflight"), 0), line("queued", raw("gateway/queued"), 1),
      line("judge pending", raw("judge/pending"), 3), line("samples waiting", raw("train/pending_samples"), 2)], zero: true }),
  ];
  return h("section", { class: "panel charts" }, h("h2", {}, "Judge and trainer"), h("div", { class: "chart-grid" }, charts));
}

function latestCurve() {
  const r = S.results && S.results.data[0];
  return h("section", { class: "panel latest" },
    h("h2", {}, h("a", { href: "#/results" }, "Learning curve"),
      r ? h("span", { class: "muted" }, ` last ${r.kind}: ${r.name}, ${stamp(r.created_at)}`) : null),
    r ? curvePlot([r]) : h("p", { class: "empty" }, "None posted yet: `clawloop demo --url` and `clawloop eval` post theirs here."));
}

function curvePlot(rs) {
  const series = rs.map((r, i) => line(i ? `${r.name} (${stamp(r.created_at)})` : r.name,
    r.curve.map(p => [p.updates, p.score]), i, { dots: true, dash: i > 0 }));
  // an evaluation's halves beside its score: what got better and what can get worse
  const halves = [["correct", "right result"], ["form", "form"]];
  if (rs.length === 1) halves.forEach(([key, label], k) => {
    const pts = rs[0].curve.filter(p => typeof p[key] === "number").map(p => [p.updates, p[key]]);
    if (pts.length) series.push(line(label, pts, 2 + k, { dots: true, dash: true }));
  });
  return h("div", { class: "chart wide" }, plot({ series, x: "num", zero: true, W: 620, H: 230 }) || h("div", { class: "empty" }, "empty curve"),
    h("div", { class: "legend" }, series.map(se => h("span", {}, swatch(se.color), se.name))),
    h("div", { class: "axis-label" }, "score by policy updates"));
}

function renderOverview() {
  return h("div", { class: "overview" }, h("div", { class: "column" }, renderSessions(S.sessions), latestCurve()), renderCharts());
}

function textBlock(cls, label, text, extra) {
  return h("div", { class: "msg " + cls }, h("div", { class: "who" }, label), text ? h("pre", {}, text) : null, extra || null);
}

const TRAIN_TEXT = {
  trained: "trained on", skipped: "consumed, skipped: no signal", waiting: "waiting for the trainer",
  unjudged: "not judged yet", untrainable: "never trained (side, aborted or unfinished)", buffer: "trainer reads the rollout buffer",
};

function turnCard(t, trainer) {
  const calls = (t.tool_calls || []).map(c => h("code", { class: "call" }, `${c.function ? c.function.name : "?"}(${c.function ? c.function.arguments : ""})`));
  const next = t.next_state ? textBlock("next", "next: " + (t.next_state.role || "?"), t.next_state.content)
    : textBlock("next none", t.final ? "session closed after this turn" : "no next state yet", "");
  const verdicts = t.judgements.map(j => {
    const cls = j.score > 0 ? "pos" : j.score < 0 ? "neg" : "zero";
    return h("div", { class: "judgement" + (j.judge === trainer.judge ? " mine" : "") },
      h("span", { class: "score " + cls }, signed(j.score)),
      h("span", { class: "judge-name" }, j.judge),
      j.reward !== null ? h("span", { class: "muted" }, ` reward ${num(j.reward)}`) : null,
      j.votes && j.votes.length ? h("div", { class: "votes" }, "votes " + j.votes.map(v => v === null ? "✗" : signed(v)).join(" ")) : null,
      j.hint ? h("div", { class: "hint" }, h("b", {}, "hint "), j.hint) : null);
  });
  const tr = t.train;
  const trainLine = h("div", { class: "train " + tr.state }, TRAIN_TEXT[tr.state] || tr.state,
    tr.at ? h("span", { class: "muted" }, ` at ${clock(tr.at)}`) : null,
    tr.judgement_id ? h("span", { class: "muted" }, ` (verdict #${tr.judgement_id}, cursor ${trainer.cursor})`) : null);
  const v = t.versions[0] === t.versions[1] ? `v${t.versions[0]}` : `v${t.versions[0]}–v${t.versions[1]}`;
  return h("article", { class: "turn", id: "turn-" + t.id },
    h("div", { class: "turn-head" }, h("b", {}, `#${t.index}` + (t.choice_index ? `.${t.choice_index}` : "")),
      h("span", { class: "tag " + t.type }, t.type), h("span", { class: "tag version", title: "policy version that produced it" }, v),
      h("span", { class: "muted" }, `${t.finish_reason} · ${t.prompt_tokens} → ${t.response_tokens} tokens · ${stamp(t.created_at)}`)),
    h("div", { class: "turn-body" },
      h("div", { class: "conv" },
        textBlock("user", t.last_role && t.last_role !== "user" ? `user (then ${t.last_role})` : "user", t.prompt),
        textBlock("assistant", "assistant", t.response, calls.length ? h("div", { class: "calls" }, calls) : null),
        next,
        t.truncated.length ? h("div", { class: "muted" }, `shortened: ${t.truncated.join(", ")}`) : null),
      h("div", { class: "verdict" }, verdicts.length ? verdicts : h("div", { class: "muted" }, "no verdict"), trainLine)));
}

function renderSession(d) {
  const s = d.session, tr = d.trainer;
  const note = tr.source === "buffer" ? "The trainer reads a rollout buffer, not these turns."
    : `“Trained” = the trainer has consumed the verdict of judge ${tr.judge}: its verdict id ≤ the trainer's cursor (${tr.cursor}), with a signal for --method ${tr.method}.`;
  return h("div", { class: "session-view" },
    h("div", { class: "panel" },
      h("a", { href: "#/", class: "back" }, "‹ sessions"),
      h("h2", { class: "sid" }, s.session_id),
      h("div", { class: "facts" },
        s.tenant ? h("span", {}, "tenant ", h("b", {}, s.tenant)) : null,
        h("span", {}, h("b", {}, num(s.turns)), " turns"),
        h("span", {}, s.closed ? `closed (${s.closed_reason || "?"}) ${stamp(s.closed_at)}` : "open"),
        h("span", {}, "started ", stamp(s.created_at)), h("span", {}, "last activity ", ago(s.last_seen)),
        verdictChips(s)),
      h("p", { class: "note" }, note),
      d.total > d.limit ? turnPager(d) : null),
    d.data.map(t => turnCard(t, tr)),
    d.total > d.limit ? h("div", { class: "panel" }, turnPager(d)) : null);
}

function turnPager(d) {
  const to = d.offset + d.data.length;
  return h("div", { class: "pager" },
    h("button", { type: "button", disabled: d.offset === 0, onclick: () => { S.turnOffset = Math.max(0, S.turnOffset - TURNS); refreshNow(); } }, "‹ earlier"),
    h("span", {}, `turns ${d.total ? d.offset + 1 : 0}–${to} of ${num(d.total)}`),
    h("button", { type: "button", disabled: to >= d.total, onclick: () => { S.turnOffset += TURNS; refreshNow(); } }, "later ›"));
}

function renderResults() {
  const rs = (S.results && S.results.data) || [];
  if (!rs.length) {
    return h("section", { class: "panel" }, h("h2", {}, "Learning curves"),
      h("p", { class: "empty" }, "No results yet. `clawloop demo --url` and `clawloop eval` post theirs to POST /api/results."));
  }
  const i = Math.min(S.resultIdx, rs.length - 1), r = rs[i];
  const prev = rs.find((o, k) => k > i && o.kind === r.kind && o.name === r.name);
  const list = h("ul", { class: "results" }, rs.map((o, k) => h("li", { class: k === i ? "on" : null },
    h("button", { type: "button", class: "link", onclick: () => { S.resultIdx = k; render(); } },
      h("span", { class: "tag " + o.kind }, o.kind), ` ${o.name} `, h("span", { class: "muted" }, stamp(o.created_at))))));
  const summary = h("table", { class: "kv" }, Object.entries(r.summary || {}).map(([k, v]) =>
    h("tr", {}, h("th", {}, k), h("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v)))));
  return h("section", { class: "panel results-view" }, h("h2", {}, "Learning curves"),
    h("div", { class: "results-grid" }, list,
      h("div", {}, h("h3", {}, `${r.kind}: ${r.name}`, prev ? h("span", { class: "muted" }, " (dashed: the previous run of it)") : null),
        curvePlot(prev ? [r, prev] : [r]), summary)));
}

function renderBuffer() {
  const b = S.buffer;
  if (!b || !b.attached) {
    return h("section", { class: "panel" }, h("h2", {}, "Rollout buffer"),
      h("p", { class: "empty" }, "No rollout buffer attached (clawloop up --buffer URL)."));
  }
  const st = b.stats;
  const head = h("p", {}, "Buffer ", h("code", {}, b.url), b.ok ? "" : h("span", { class: "bad" }, ` unreachable: ${b.error}`));
  if (!st) return h("section", { class: "panel" }, h("h2", {}, "Rollout buffer"), head);
  const totals = h("div", { class: "facts" }, [["written", st.total_written], ["read", st.total_read], ["open groups", st.open_groups],
    ["ready groups", st.ready_groups], ["dropped stale", st.dropped_stale_groups], ["dropped invalid", st.dropped_invalid_groups],
    ["filtered items", st.filtered_items]].map(([k, v]) => h("span", {}, h("b", {}, num(v ?? 0)), " " + k)),
    st.current_task ? h("span", {}, "current task ", h("b", {}, st.current_task)) : null);
  const cols = [["group_size", "group size"], ["written", "written"], ["read", "read"], ["open_groups", "open groups"],
    ["open_items", "open items"], ["ready_groups", "ready groups"], ["ready_items", "ready items"]];
  const tasks = h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "task"), cols.map(([, l]) => h("th", { class: "n" }, l)))),
    h("tbody", {}, Object.entries(st.per_task || {}).map(([task, d]) =>
      h("tr", {}, h("td", {}, task), cols.map(([k]) => h("td", { class: "n" }, num(d[k] ?? null)))))));
  const runs = (st.rollouts || []).map(r => h("tr", {}, h("td", {}, r.task_type), h("td", {}, r.state), h("td", { class: "n" }, num(r.pid)),
    h("td", {}, stamp(r.started_at))));
  const src = Object.entries(b.source || {});
  return h("section", { class: "panel buffer" }, h("h2", {}, "Rollout buffer"), head, totals,
    h("h3", {}, "Tasks and groups"), tasks,
    runs.length ? [h("h3", {}, "Generators"), h("table", {}, h("thead", {}, h("tr", {}, ["task", "state", "pid", "started"].map(c => h("th", {}, c)))), h("tbody", {}, runs))] : null,
    src.length ? [h("h3", {}, "What this trainer pulled"), h("table", { class: "kv" }, src.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, num(v)))))] : null);
}

function render() {
  const r = route();
  let view;
  if (r.name === "session") view = S.session ? renderSession(S.session) : h("p", { class: "empty" }, "loading…");
  else if (r.name === "results") view = renderResults();
  else if (r.name === "buffer") view = renderBuffer();
  else view = S.sessions ? renderOverview() : h("p", { class: "empty" }, "loading…");
  document.getElementById("view").replaceChildren(view);
}

// ---- refreshing ----
async function refresh() {
  clearTimeout(S.timer);
  const r = route();
  let changed = true;
  try {
    const st = await api("status");
    if (S.startedAt !== st.started_at) { S.startedAt = st.started_at; S.hist = { t: [], series: {} }; }
    await loadHistory();
    renderHeader(st);
    renderCards(st);
    if (r.name === "overview") {
      S.sessions = await api(`sessions?limit=${PAGE}&offset=${S.offset}`);
      if (!S.verdicts || S.tick % 3 === 0) S.verdicts = await api(`judgements?since=${st.now - 3600}&bucket_s=60`);
      if (!S.results || S.tick % 5 === 0) S.results = await api("results?limit=50");
    } else if (r.name === "session") {
      const d = await api(`sessions/${encodeURIComponent(r.id)}?limit=${TURNS}&offset=${S.turnOffset}`);
      // Re-drawn only when it changed: a reader's text selection survives the refresh.
      const key = JSON.stringify(d);
      changed = key !== S.shown || !S.session;
      S.shown = key;
      S.session = d;
    } else if (r.name === "results") {
      S.results = await api("results?limit=50");
    } else if (r.name === "buffer") {
      S.buffer = await api("buffer");
    }
    if (changed) render();
    document.getElementById("updated").textContent = "updated " + clock(Date.now() / 1000);
    document.getElementById("updated").className = "updated";
  } catch (e) {
    if (!(e instanceof NeedKey)) {
      document.getElementById("updated").textContent = "error: " + e.message;
      document.getElementById("updated").className = "updated bad";
      if (r.name === "session" && !S.session) document.getElementById("view").replaceChildren(h("p", { class: "empty bad" }, e.message));
    }
  }
  scheduled();
}

function scheduled() {
  S.tick++;
  clearTimeout(S.timer);
  if (document.getElementById("login").hidden) S.timer = setTimeout(refresh, REFRESH_MS);
}

function refreshNow() { S.tick = 0; refresh(); }

window.addEventListener("hashchange", () => {
  S.session = null; S.shown = ""; S.turnOffset = 0; render(); refreshNow();
});

document.getElementById("login-form").addEventListener("submit", ev => {
  ev.preventDefault();
  const key = document.getElementById("login-key").value.trim();
  if (!key) return;
  sessionStorage.setItem(KEY, key);
  document.getElementById("login-key").value = "";
  document.getElementById("login").hidden = true;
  refreshNow();
});

document.getElementById("forget-key").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  location.reload();
});

refresh();
