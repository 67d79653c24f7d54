// The live status view: /stats and /stats/recent every second, /v1/models when the state changes.

import { api, getJSON, Unauthorized } from "./api.js";

const POLL_MS = 1000;
const HISTORY = 60; // samples in the sparkline
const $ = (id) => document.getElementById(id);

export class StatusView {
  constructor(onUnauthorized) {
    this.onUnauthorized = onUnauthorized;
    this.previous = null; // the last /stats sample, for rates
    this.history = [];
    this.state = null;
    this.model = null;
    this.polling = false;
  }

  start() {
    if (this.polling) return;
    this.polling = true;
    this.tick();
  }

  async tick() {
    try {
      await this.refresh();
    } catch (error) {
      if (error instanceof Unauthorized) {
        this.polling = false; // until a key is saved
        this.onUnauthorized();
        return;
      }
      this.showState("offline", String(error.message || error));
    }
    setTimeout(() => this.tick(), POLL_MS);
  }

  async refresh() {
    const [stats, recent] = await Promise.all([getJSON("/stats"), getJSON("/stats/recent")]);
    if (stats.state !== this.state || this.model === null) await this.loadModel(stats.state);
    this.showState(stats.state, stats.state === "ready" ? "" : await healthError());
    this.showStats(stats);
    this.showRecent(recent);
  }

  async loadModel(state) {
    const models = await getJSON("/v1/models");
    const card = models.data?.[0];
    this.model = card ? card.id : null;
    $("model-name").textContent = this.model || "no model";
    const context = card?.context_length;
    $("model-facts").textContent = context ? `${context.toLocaleString()} tokens of context` : "";
    this.state = state;
  }

  showState(state, error) {
    const badge = $("model-state");
    badge.dataset.state = state;
    badge.textContent = state;
    badge.title = error || "";
  }

  showStats(stats) {
    if (stats.generated_tokens === undefined) {
      this.previous = null; // no counters until the engine has loaded
      return;
    }
    $("rows-running").textContent = stats.num_requests_running;
    $("rows-waiting").textContent = stats.num_requests_waiting;
    const rates = this.rates(stats);
    $("gen-rate").textContent = rates ? rates.generated.toFixed(1) : "–";
    $("prompt-rate").textContent = rates ? rates.prompt.toFixed(0) : "–";
    const kv = stats.kv_cache_usage_perc || 0;
    $("kv-use").textContent = percent(kv);
    $("kv-bar").style.width = `${Math.min(100, kv * 100).toFixed(1)}%`;
    const cached = Math.max(0, stats.prompt_tokens - stats.prefill_tokens);
    $("hit-rate").textContent = stats.prompt_tokens ? percent(cached / stats.prompt_tokens) : "–";
    $("cached-tokens").textContent = cached.toLocaleString();
    $("computed-tokens").textContent = stats.prefill_tokens.toLocaleString();
    showExtras(stats);
    this.drawSpark();
  }

  // Tokens per second from two samples of the counters (the server's own clock, `at`).
  rates(stats) {
    const before = this.previous;
    this.previous = stats;
    if (!before || stats.at <= before.at || stats.generated_tokens < before.generated_tokens) return null;
    const seconds = stats.at - before.at;
    const rate = {
      generated: (stats.generated_tokens - before.generated_tokens) / seconds,
      prompt: (stats.prefill_tokens - before.prefill_tokens) / seconds,
    };
    this.history.push(rate.generated);
    if (this.history.length > HISTORY) this.history.shift();
    return rate;
  }

  drawSpark() {
    const canvas = $("spark");
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth * ratio;
    const height = canvas.clientHeight * ratio;
    if (!width || !height) return;
    canvas.width = width;
    canvas.height = height;
    const g = canvas.getContext("2d");
    if (this.history.length < 2) return;
    const color = getComputedStyle(document.documentElement).getPropertyValue("--accent").trim();
    const top = Math.max(1, ...this.history);
    const step = width / (HISTORY - 1);
    const x0 = width - (this.history.length - 1) * step;
    const y = (v) => height - 2 * ratio - (v / top) * (height - 4 * ratio);
    g.beginPath();
    this.history.forEach((v, i) => (i ? g.lineTo(x0 + i * step, y(v)) : g.moveTo(x0, y(v))));
    g.strokeStyle = color;
    g.lineWidth = 1.5 * ratio;
    g.stroke();
    g.lineTo(width, height);
    g.lineTo(x0, height);
    g.closePath();
    g.globalAlpha = 0.12;
    g.fillStyle = color;
    g.fill();
  }

  showRecent(recent) {
    const rows = [...recent.in_flight, ...recent.ended];
    const body = $("recent-rows");
    if (!rows.length) return;
    body.replaceChildren(...rows.slice(0, 25).map(recentRow));
  }
}

async function healthError() {
  try {
    const body = await (await api("/health")).json();
    return typeof body.error === "string" ? body.error : "";
  } catch {
    return "";
  }
}

const EXTRAS = { prefix_cache_bytes: "held", prefix_cache_blocks: "blocks", prompt_tokens_from_disk: "read from disk" };

// What the prefix cache holds, and whatever other prefix-cache counters the engine reports.
function showExtras(stats) {
  const list = $("prefix-extras");
  const keys = Object.keys(stats).filter((k) => k in EXTRAS || /^(prefix|prompt)_cache_/.test(k));
  list.replaceChildren(
    ...keys.flatMap((k) => {
      const name = EXTRAS[k] ?? k.replace(/^(prefix|prompt)_cache_/, "").replaceAll("_", " ");
      return [cell("dt", name), cell("dd", formatCount(k, stats[k]))];
    }),
  );
}

function formatCount(key, value) {
  if (typeof value !== "number") return String(value);
  if (/bytes/.test(key)) return bytes(value);
  if (/perc|rate|ratio/.test(key) && value <= 1) return percent(value);
  return value.toLocaleString();
}

function recentRow(r) {
  const tr = document.createElement("tr");
  const live = r.phase !== "done";
  const status = live ? cell("td", r.phase, "live") : cell("td", statusText(r), r.status < 400 ? "status-ok" : "status-bad");
  if (r.error || r.refusal) status.title = [r.refusal, r.error].filter(Boolean).join(": ");
  tr.append(
    cell("td", clock(r.arrived_unix)),
    cell("td", `${r.method} ${r.route}`, "route"),
    status,
    cell("td", count(r.prompt_tokens), "num"),
    cell("td", live ? "" : count(r.cached_tokens), "num"),
    cell("td", count(r.completion_tokens), "num"),
    cell("td", r.ttft_s == null ? "–" : duration(r.ttft_s), "num"),
    cell("td", duration(r.elapsed_s), "num"),
    phaseCell(r),
  );
  if (r.id) tr.title = r.id;
  return tr;
}

function statusText(r) {
  if (r.status >= 400) return String(r.status);
  return r.outcome && r.outcome !== "-" ? `${r.status} ${r.outcome}` : String(r.status);
}

// One bar: reading and parsing, queue and prefill, decoding, and finishing, as parts of the whole.
function phaseCell(r) {
  const td = document.createElement("td");
  const bar = document.createElement("div");
  bar.className = "phases";
  const total = r.elapsed_s || 0;
  const p = r.phases_s || {};
  const submitted = p.submitted ?? total;
  const first = p.first_token ?? total;
  const last = p.last_token ?? total;
  const marks = [
    ["ph-parse", submitted],
    ["ph-prefill", Math.max(submitted, first)],
    ["ph-decode", Math.max(first, last)],
    ["ph-write", total],
  ];
  let start = 0;
  for (const [name, end] of marks) {
    const span = document.createElement("span");
    span.className = name;
    span.style.width = total > 0 ? `${(Math.max(0, Math.min(end, total) - start) / total) * 100}%` : "0";
    start = Math.max(start, Math.min(end, total));
    bar.append(span);
  }
  td.append(bar);
  return td;
}

function cell(tag, text, className) {
  const el = document.createElement(tag);
  el.textContent = text;
  if (className) el.className = className;
  return el;
}

const count = (n) => (n == null ? "–" : Number(n).toLocaleString());
function percent(f) {
  if (f > 0 && f < 0.001) return "<0.1%";
  return `${(f * 100).toFixed(f < 0.1 && f > 0 ? 1 : 0)}%`;
}
const clock = (unix) => new Date(unix * 1000).toLocaleTimeString([], { hour12: false });

function duration(s) {
  if (s == null) return "–";
  return s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(s < 10 ? 2 : 1)} s`;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
