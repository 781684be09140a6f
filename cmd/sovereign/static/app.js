// The status page: renders every snapshot the server pushes over
// server-sent events, and animates TTL bars and ages between snapshots.
"use strict";

let state = null;     // the last snapshot
let receivedAt = 0;   // performance.now() when it arrived

// h builds an element; children are nodes or strings (always text, never HTML).
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function dur(s) {
  if (s < 0) s = 0;
  if (s < 10) return s.toFixed(1) + " s";
  if (s < 120) return Math.round(s) + " s";
  const m = Math.floor(s / 60);
  if (m < 120) return m + " min " + Math.round(s - m * 60) + " s";
  const hr = Math.floor(m / 60);
  return hr + " h " + (m - hr * 60) + " min";
}

// elapsed returns seconds since the snapshot arrived.
function elapsed() { return (performance.now() - receivedAt) / 1000; }

// shared reports whether e is held in Shared mode: its card lists every
// holder.
function shared(e) { return e.held && e.mode === "shared"; }

// holderList lists every holder of a shared key (or of a key with several
// holders), oldest first, each with its mode, term, age, TTL and metadata.
function holderList(e) {
  return h("ol", { class: "holders" }, (e.holders || []).map((x, i) => {
    const md = Object.entries(x.metadata || {}).sort().map(([k, v]) => k + "=" + v).join("  ");
    return h("li", { "data-holder": x.id, "data-index": String(i) },
      h("span", { class: "hid" }, x.id),
      h("span", { class: "hmeta" }, x.mode + (x.limit ? ", limit " + x.limit : "") + ", term " + x.term),
      h("span", { class: "hage" }),
      h("span", { class: "httl" }),
      md ? h("span", { class: "hmd" }, md) : null);
  }));
}

function card(e) {
  const cls = ["card", e.held ? "held" : "free"];
  if (e.warnings && e.warnings.length) cls.push("stale");
  const n = (e.holders || []).length;
  let who = e.held ? e.holder : "no leader";
  if (shared(e)) who = n + " shared holder" + (n === 1 ? "" : "s") + (e.limit ? " of " + e.limit : "");
  const c = h("section", { class: cls.join(" "), "data-key": e.key, "data-held": String(e.held), "data-holders": String(n) },
    h("div", { class: "top" },
      h("span", { class: "kind " + e.kind }, e.kind),
      h("span", { class: "name" }, e.name)),
    h("div", { class: "holder", "data-holder": e.holder || "" }, who));
  if (shared(e) || n > 1) c.append(holderList(e));
  if (e.held && !shared(e)) {
    const since = e.since ? new Date(e.since) : null;
    c.append(h("dl", {},
      h("dt", {}, "term"), h("dd", { class: "term" }, String(e.term)),
      h("dt", {}, "since"), h("dd", { class: "since", title: since ? since.toISOString() : "" },
        since ? "" : "?"),
      h("dt", {}, "heartbeat"), h("dd", { class: "hb" }, e.heartbeat_age_seconds == null ? "none" : ""),
      Object.keys(e.metadata || {}).length ? [h("dt", {}, "metadata"),
        h("dd", {}, Object.entries(e.metadata).sort().map(([k, v]) => k + "=" + v).join("  "))] : null));
  }
  if (e.held) c.append(h("div", { class: "bar" }, h("div", {})), h("div", { class: "ttl" }));
  if (e.members && e.members.length) {
    c.append(h("div", { class: "members", title: "instances with a live heartbeat" },
      e.members.map(m => h("span", { class: "chip" + (m.holder ? " holder-chip" : ""), title: "heartbeat " + dur(m.age_seconds) + " ago" },
        (m.holder ? "★ " : "") + m.id))));
  }
  for (const w of e.warnings || []) c.append(h("div", { class: "warning" }, w));
  return c;
}

function render() {
  const grid = document.getElementById("grid");
  document.getElementById("backend").textContent = state.backend + (state.prefix ? "  prefix " + state.prefix : "");
  const err = document.getElementById("error");
  err.hidden = state.ok;
  err.textContent = state.ok ? "" : "Backend unreachable: " + state.error + (state.last_ok ? " (showing the state of " + new Date(state.last_ok).toLocaleTimeString() + ")" : "");
  grid.replaceChildren(...state.entries.map(card));
  document.getElementById("empty").hidden = state.entries.length > 0;
  tick();
}

// tick updates what changes between snapshots: TTL bars, ages.
function tick() {
  if (!state) return;
  const dt = elapsed();
  const now = Date.now();
  for (const e of state.entries) {
    const c = document.querySelector('section[data-key="' + CSS.escape(e.key) + '"]');
    if (!c || !e.held) continue;
    const left = Math.max(0, e.ttl_seconds - dt);
    const full = Math.max(e.full_ttl_seconds || e.ttl_seconds, 0.001);
    const frac = Math.min(1, left / full);
    const bar = c.querySelector(".bar");
    bar.firstChild.style.width = (frac * 100).toFixed(1) + "%";
    bar.className = "bar" + (frac < 0.2 ? " crit" : frac < 0.5 ? " low" : "");
    c.querySelector(".ttl").textContent = (shared(e) ? "oldest holder's lease: " : "lease: ") + dur(left) + " left of " + dur(full);
    const sinceEl = c.querySelector(".since"), hbEl = c.querySelector(".hb");
    if (e.since && sinceEl) sinceEl.textContent = dur((now - new Date(e.since)) / 1000) + " ago";
    if (e.heartbeat_age_seconds != null && hbEl) hbEl.textContent = dur(e.heartbeat_age_seconds + dt) + " ago";
    for (const li of c.querySelectorAll(".holders li")) {
      const x = e.holders[Number(li.dataset.index)];
      if (!x) continue;
      li.querySelector(".httl").textContent = dur(x.ttl_seconds - dt) + " left";
      li.querySelector(".hage").textContent = x.since ? "since " + dur((now - new Date(x.since)) / 1000) + " ago" : "";
    }
  }
  document.getElementById("updated").textContent = "updated " + dur(dt) + " ago";
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/events");
  es.onopen = () => { conn.className = "conn live"; conn.textContent = "live"; };
  es.onerror = () => { conn.className = "conn connecting"; conn.textContent = "reconnecting…"; };
  es.onmessage = ev => {
    state = JSON.parse(ev.data);
    receivedAt = performance.now();
    render();
  };
}

setInterval(tick, 200);
connect();
