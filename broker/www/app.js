// RoarMQ's web console: plain JS over the management API, no build step, nothing from a CDN.
// In the manner of RabbitMQ's management UI: every list paged, sorted and filtered by the
// server and refreshed every few seconds (the selector in the header; "Do not refresh"
// pauses), charts drawn from the broker's own sample history (?lengths_age=&msg_rates_age=),
// a confirmation before anything is deleted, purged or closed.
"use strict";

const store = window.localStorage;
const state = {
  auth: sessionStorage.getItem("roarmq-auth"), me: null, timer: null, shown: 0, update: null,
  refresh: Number(store.getItem("roarmq-refresh") ?? 5), vhost: store.getItem("roarmq-vhost") || "",
  range: Number(store.getItem("roarmq-range") || 60), lists: {}, catalogue: null, vhosts: null,
};
const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => [...root.querySelectorAll(sel)];
const enc = encodeURIComponent;
const size = n => n == null ? "?" : n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n >= 1 << 10 ? (n / (1 << 10)).toFixed(1) + " KiB" : n + " B";

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

// One entry per protocol and port, with its addresses (the API lists a row per address).
function listenerText(rows) {
  const byPort = new Map();
  for (const l of rows) {
    const key = l.protocol + " " + l.port;
    if (!byPort.has(key)) byPort.set(key, []);
    byPort.get(key).push(l.ip_address);
  }
  return [...byPort].map(([key, hosts]) => esc(`${key} (${hosts.join(", ")})`)).join(", ");
}

// The alarms an operator must see: memory, disk, and a message store that cannot write.
function alarmText(o) {
  const set = [];
  if (o.memory_alarm) set.push("memory");
  if (o.disk_free_alarm) set.push("disk");
  const st = o.message_store || {};
  if (st.state === "failed") set.push("message store failed: " + st.error);
  return set.length ? `<span class="error">${esc(set.join("; "))}</span>` : "none";
}

async function api(method, path, body, headers = {}) {
  headers = { Authorization: "Basic " + state.auth, "X-Requested-With": "XMLHttpRequest", ...headers };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch("/api" + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (resp.status === 401) { logout("Login failed or not allowed"); throw new Error("unauthorised"); }
  const text = await resp.text();
  const data = text ? JSON.parse(text) : null;
  if (!resp.ok) throw new Error((data && (data.reason || data.error)) || resp.statusText);
  return data;
}

function logout(message) {
  sessionStorage.removeItem("roarmq-auth");
  state.auth = null;
  clearInterval(state.timer);
  $("#login").hidden = false;
  $("#view").innerHTML = "";
  $("#who").textContent = "";
  $("#login-error").textContent = message || "";
}

$("#login").addEventListener("submit", async ev => {
  ev.preventDefault();
  const form = ev.target;
  state.auth = btoa(form.user.value + ":" + form.password.value);
  try {
    const me = await api("GET", "/whoami");
    sessionStorage.setItem("roarmq-auth", state.auth);
    form.hidden = true;
    showWho(me);
    route();
  } catch (err) { /* logout() has said why */ }
});

function showWho(me) {
  state.me = me;
  $("#who").innerHTML = `${esc(me.name)} <button id="logout">Log out</button>`;
  $("#logout").onclick = () => logout();
  vhostChooser();
}

// -- the header: vhost, refresh ----------------------------------------------------------

async function vhostChooser() {
  try { state.vhosts = (await api("GET", "/vhosts?columns=name")).map(v => v.name); } catch (err) { return; }
  if (state.vhost && !state.vhosts.includes(state.vhost)) state.vhost = "";
  const sel = $("#vhost");
  sel.innerHTML = `<option value="">All</option>` + state.vhosts.map(v => `<option ${v === state.vhost ? "selected" : ""}>${esc(v)}</option>`).join("");
  sel.onchange = () => { state.vhost = sel.value; store.setItem("roarmq-vhost", sel.value); for (const l of Object.values(state.lists)) l.page = 1; route(); };
}

function refreshChooser() {
  const sel = $("#refresh");
  sel.value = String(state.refresh);
  sel.onchange = () => { state.refresh = Number(sel.value); store.setItem("roarmq-refresh", sel.value); arm(); };
}

// The timer that updates the page shown: every `state.refresh` seconds, none when paused.
function arm() {
  clearInterval(state.timer);
  state.timer = null;
  const paused = !state.refresh;
  $("#refreshed").textContent = paused ? "Refresh paused" : `Refreshed ${new Date().toLocaleTimeString()}`;
  if (typeof state.update !== "function" || paused) return;
  const shown = state.shown;
  state.timer = setInterval(async () => {
    if (shown !== state.shown || document.hidden) return;
    try { await state.update(); $("#refreshed").textContent = `Refreshed ${new Date().toLocaleTimeString()}`; } catch (err) { /* shown next time */ }
  }, state.refresh * 1000);
}

// -- tables and lists --------------------------------------------------------------------

// A column: {key, title, sort (the API's sort key; absent: not sortable), html(row) | value(row)}.
function table(rows, columns, opts = {}) {
  const head = columns.map(c => {
    const sorted = opts.sort && opts.sort === c.sort ? " sorted" + (opts.reverse ? " rev" : "") : "";
    return `<th ${c.sort ? `data-sort="${esc(c.sort)}"` : ""} class="${c.sort ? "sortable" : ""}${sorted}">${esc(c.title)}</th>`;
  }).join("");
  const cell = (c, r) => `<td${c.cls ? ` class="${c.cls}"` : ""}>${c.html ? c.html(r) : esc(c.value ? c.value(r) : r[c.key])}</td>`;
  const body = rows.map(r => "<tr>" + columns.map(c => cell(c, r)).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body || `<tr><td colspan="${columns.length}">(none)</td></tr>`}</tbody></table>`;
}

const PAGE_SIZES = [20, 50, 100, 500];

// A list the server pages, sorts and filters (?page=&page_size=&sort=&name=&use_regex=): the
// browser gets one page, whatever the broker holds. Drawn into `into` once (the filter keeps
// its focus), its rows again on each refresh. Returns the update.
async function pagedList(into, spec) {
  const id = spec.id;
  const view = state.lists[id] || (state.lists[id] = { page: 1, size: 100, sort: spec.sort || "name", reverse: false, name: "", regex: false });
  into.innerHTML = `<div class="list" id="list-${esc(id)}"><div class="pager">
      <label class="inline">Filter <input class="filter" placeholder="name" value="${esc(view.name)}"></label>
      <label class="inline" title="Filter by regular expression"><input type="checkbox" class="regex" ${view.regex ? "checked" : ""}> Regex</label>
      <button class="prev">‹</button><span class="where"></span><button class="next">›</button>
      <label class="inline">Page size <select class="size">${PAGE_SIZES.map(n => `<option ${n === view.size ? "selected" : ""}>${n}</option>`).join("")}</select></label>
      <span class="error list-error"></span></div><div class="rows"></div></div>`;
  const box = $(".list", into);
  const path = () => {
    const scoped = spec.vhostScoped !== false && state.vhost ? "/" + enc(state.vhost) : "";
    return `${spec.path}${scoped}?page=${view.page}&page_size=${view.size}&name=${enc(view.name)}&use_regex=${view.regex}`
      + (view.sort ? `&sort=${enc(view.sort)}&sort_reverse=${view.reverse}` : "");
  };
  const update = async () => {
    let data;
    try { data = await api("GET", path()); } catch (err) {
      if (/page_out_of_range|Page out of range/.test(err.message) && view.page > 1) { view.page = 1; return update(); }
      $(".list-error", box).textContent = err.message;
      return;
    }
    if (!box.isConnected) return;
    $(".list-error", box).textContent = "";
    $(".where", box).textContent = `page ${data.page} of ${data.page_count} · ${data.filtered_count} of ${data.total_count}`;
    $(".prev", box).disabled = view.page <= 1;
    $(".next", box).disabled = view.page >= data.page_count;
    $(".rows", box).innerHTML = table(data.items, spec.columns, view);
    for (const th of $$("th[data-sort]", box)) {
      th.onclick = () => { view.reverse = view.sort === th.dataset.sort ? !view.reverse : false; view.sort = th.dataset.sort; update(); };
    }
    if (spec.bind) spec.bind(box);
  };
  const filter = $(".filter", box);
  filter.oninput = debounce(() => { view.name = filter.value; view.page = 1; update(); }, 300);
  $(".regex", box).onchange = e => { view.regex = e.target.checked; view.page = 1; update(); };
  $(".size", box).onchange = e => { view.size = Number(e.target.value); view.page = 1; update(); };
  $(".prev", box).onclick = () => { view.page--; update(); };
  $(".next", box).onclick = () => { view.page++; update(); };
  await update();
  return update;
}

function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

// Several updates as one (a page with a list and a live card).
const all = updates => () => Promise.all(updates.filter(Boolean).map(u => u()));

const objectPath = (kind, r) => `#/${kind}/${enc(r.vhost)}/${enc(r.name || "amq.default")}`;
const link = (kind, r) => `<a href="${objectPath(kind, r)}">${esc(r.name || "(AMQP default)")}</a>`;
const details = (r, key) => (r.message_stats && r.message_stats[key + "_details"]) || null;
const rate = (r, key) => (details(r, key) || { rate: 0 }).rate;
// The API's sort key of a rate column (the broker sorts on its last sample, page by page).
const rateSort = key => `message_stats.${key}_details.rate`;
const rateText = (r, key) => r.message_stats && r.message_stats[key + "_details"] ? `${rate(r, key)}/s` : "";

// RabbitMQ's abbreviations of the arguments a queue or exchange list shows (global.js's
// KNOWN_ARGS); any other argument is "Args". Display only: the arguments themselves, their
// values and checks are the broker's (GET /api/queue-arguments).
const SHORT = {
  "alternate-exchange": "AE", "x-message-ttl": "TTL", "x-expires": "Exp", "x-max-length": "Lim",
  "x-max-length-bytes": "Lim B", "x-delivery-limit": "DlL", "x-overflow": "Ovfl", "x-dead-letter-exchange": "DLX",
  "x-dead-letter-routing-key": "DLK", "x-queue-master-locator": "ML", "x-max-priority": "Pri", "x-single-active-consumer": "SAC",
};

// D, AD, Excl, I, then one badge a known argument, "Args" for the rest, and the policy.
function features(r) {
  const out = [];
  const badge = (text, title) => out.push(`<abbr class="feature" title="${esc(title)}">${esc(text)}</abbr>`);
  if (r.durable) badge("D", "durable: true");
  if (r.auto_delete) badge("AD", "auto-delete: true");
  if (r.exclusive) badge("Excl", "exclusive: true");
  if (r.internal) badge("I", "internal: true");
  const other = [];
  for (const [key, value] of Object.entries(r.arguments || {})) {
    if (key === "x-queue-type") continue;
    if (SHORT[key]) badge(SHORT[key], `${key}: ${JSON.stringify(value)}`);
    else other.push(`${key}: ${JSON.stringify(value)}`);
  }
  if (other.length) badge("Args", other.join("\n"));
  if (r.policy) out.push(`<span class="policy" title="policy">${esc(r.policy)}</span>`);
  if (r.operator_policy) out.push(`<span class="policy" title="operator policy">${esc(r.operator_policy)}</span>`);
  return out.join(" ");
}

// Arguments, a policy's definition, headers: a key / value table, not raw JSON.
function kvTable(obj, empty = "(none)") {
  const entries = Object.entries(obj || {});
  if (!entries.length) return `<span class="muted">${esc(empty)}</span>`;
  return `<table class="kv">${entries.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(typeof v === "object" && v !== null ? JSON.stringify(v) : v)}</td></tr>`).join("")}</table>`;
}

// -- confirmations and forms -------------------------------------------------------------

// Every delete, purge and close asks first, as RabbitMQ's UI does.
function confirmed(question) {
  return window.confirm(question);
}

// A form's submit handler: attempt() its action.
function submit(action, redraw = true) {
  return ev => { ev.preventDefault(); return attempt(ev.target, action, redraw); };
}

// Run a form's action, then show its error in the form, or redraw the page.
async function attempt(form, action, redraw = true) {
  for (const old of form.querySelectorAll(":scope > .error, :scope > .ok")) old.remove();
  try {
    const out = await action(form);
    if (redraw) await route();
    return out;
  } catch (err) {
    if (err.message !== "unauthorised") form.insertAdjacentHTML("beforeend", `<p class="error">${esc(err.message)}</p>`);
  }
}

// A button doing something after a confirmation; its errors shown beside it.
function dangerous(button, question, action) {
  button.onclick = async () => {
    if (!confirmed(question)) return;
    const where = button.closest(".card, .list, #view");
    for (const old of where.querySelectorAll(":scope > .error")) old.remove();
    try { await action(); } catch (err) {
      if (err.message !== "unauthorised") where.insertAdjacentHTML("beforeend", `<p class="error">${esc(err.message)}</p>`);
    }
  };
}

async function catalogue() {
  if (!state.catalogue) state.catalogue = await api("GET", "/queue-arguments");
  return state.catalogue;
}

async function vhostOptions() {
  if (!state.vhosts) state.vhosts = (await api("GET", "/vhosts?columns=name")).map(v => v.name);
  const chosen = state.vhost || "/";
  return state.vhosts.map(v => `<option ${v === chosen ? "selected" : ""}>${esc(v)}</option>`).join("");
}

// An arguments editor (RabbitMQ's): rows of key = value and a type, a new empty row as the
// last one fills, and "Add:" links for the arguments the broker knows (`known`: rows of GET
// /api/queue-arguments, `keyOf` picks the key: the argument or the policy key).
function argsEditor(name, known = [], keyOf = a => a.argument) {
  const links = known.filter(keyOf).map(a => `<a href="" data-arg="${esc(keyOf(a))}" data-kind="${esc(a.type)}"
    data-values="${esc((a.values || []).join(" | "))}" data-types="${esc((a.queue_types || a.exchange_types || []).join(" "))}">${esc(a.label)}</a>`).join(" ");
  return `<div class="args" data-args="${esc(name)}"><div class="arg-rows">${argRow()}</div>
    ${links ? `<p class="arg-help">Add: ${links}</p>` : ""}</div>`;
}

function argRow(key = "", type = "string") {
  const types = [["string", "String"], ["number", "Number"], ["boolean", "Boolean"], ["list", "List"]];
  return `<div class="arg-row"><input class="arg-key" placeholder="key" value="${esc(key)}"> = <input class="arg-value" placeholder="value">
    <select class="arg-type">${types.map(([v, t]) => `<option value="${v}" ${v === type ? "selected" : ""}>${t}</option>`).join("")}</select></div>`;
}

function bindArgs(root) {
  for (const editor of $$(".args", root)) {
    const rows = $(".arg-rows", editor);
    const grow = () => {
      const last = rows.lastElementChild;
      if ($(".arg-key", last).value || $(".arg-value", last).value) rows.insertAdjacentHTML("beforeend", argRow());
    };
    rows.addEventListener("input", grow);
    for (const a of $$("[data-arg]", editor)) {
      a.onclick = ev => {
        ev.preventDefault();
        let row = $$(".arg-row", rows).find(r => !$(".arg-key", r).value);
        if (!row) { rows.insertAdjacentHTML("beforeend", argRow()); row = rows.lastElementChild; }
        $(".arg-key", row).value = a.dataset.arg;
        $(".arg-type", row).value = a.dataset.kind === "number" || a.dataset.kind === "boolean" ? a.dataset.kind : "string";
        $(".arg-value", row).placeholder = a.dataset.values || (a.dataset.kind === "boolean" ? "true | false" : "value");
        $(".arg-value", row).focus();
        grow();
      };
    }
  }
}

// Only the helper links that apply to a queue (or exchange) type.
function filterArgLinks(editor, type) {
  for (const a of $$("[data-arg]", editor)) a.hidden = !!a.dataset.types && !a.dataset.types.split(" ").includes(type);
}

// The editor's table, typed as chosen; throws on a value that is not of its type.
function readArgs(root, name) {
  const out = {};
  for (const row of $$(`[data-args="${name}"] .arg-row`, root)) {
    const key = $(".arg-key", row).value.trim(), text = $(".arg-value", row).value, type = $(".arg-type", row).value;
    if (!key) continue;
    if (type === "number") {
      if (text.trim() === "" || Number.isNaN(Number(text))) throw new Error(`${key}: "${text}" is not a number`);
      out[key] = Number(text);
    } else if (type === "boolean") {
      if (!["true", "false"].includes(text.trim())) throw new Error(`${key}: "${text}" is not true or false`);
      out[key] = text.trim() === "true";
    } else if (type === "list") {
      out[key] = text.trim().startsWith("[") ? JSON.parse(text) : text.split(",").map(s => s.trim()).filter(Boolean);
    } else out[key] = text;
  }
  return out;
}

const yesNo = (name, yes = false) => `<select name="${name}"><option value="false" ${yes ? "" : "selected"}>No</option><option value="true" ${yes ? "selected" : ""}>Yes</option></select>`;

// -- charts from the broker's history ----------------------------------------------------

// One colour a meaning, on every page.
const BLUE = "#1565c0", GREEN = "#2e7d32", ORANGE = "#ef6c00", PURPLE = "#6a1b9a", PINK = "#ad1457", TEAL = "#00897b", BROWN = "#8d6e63", GREY = "#616161";
const RANGES = [[60, "Last minute"], [600, "Last ten minutes"]];

// The query that asks the broker for its samples over the chosen range, every 5 s.
const ranged = () => `lengths_age=${state.range}&lengths_incr=5&msg_rates_age=${state.range}&msg_rates_incr=5`;

// The two kinds of chart: an object's message counts (`counts` picks where they are: the
// row, or the overview's queue_totals), and its message_stats rates ([label, colour,
// counter]). A series: [label, colour, figure(obj) for the legend, points(obj) [{t, v}]].
const depthChart = counts => ({ id: "messages", title: "Queued messages", unit: "",
  series: [["ready", TEAL, "messages_ready"], ["unacked", BROWN, "messages_unacknowledged"], ["total", GREY, "messages"]].map(([label, colour, key]) =>
    [label, colour, o => counts(o)[key], o => samples(counts(o)[key + "_details"])]) });
const rateChart = (series, note) => ({ id: "rates", title: "Message rates (per second)", unit: "/s", note,
  series: series.map(([label, colour, counter]) => [label, colour, o => rate(o, counter), o => rates(samples(details(o, counter)))]) });

// RabbitMQ's samples (newest first) as points oldest first.
const samples = d => ((d && d.samples) || []).map(s => ({ t: s.timestamp, v: s.sample })).reverse();
// A counter's samples as its rate between each two.
const rates = points => points.slice(1).map((p, i) => ({ t: p.t, v: p.t > points[i].t ? Math.max(p.v - points[i].v, 0) * 1000 / (p.t - points[i].t) : 0 }));

// Cards in `into`, a line chart each of an object's figures over the chosen range.
function showCharts(into, obj, specs) {
  const legend = spec => spec.series.map(([label, colour, figure]) =>
    `<span data-series="${esc(label)}"><i class="swatch" style="background:${colour}"></i>${esc(label)} <b>${esc(figure(obj) ?? 0)}</b>${esc(spec.unit)}</span>`);
  const chooser = `<select class="range" title="Chart range">${RANGES.map(([s, t]) => `<option value="${s}" ${s === state.range ? "selected" : ""}>${t}</option>`).join("")}</select>`;
  into.innerHTML = specs.map(spec => `<div class="card chart" id="chart-${esc(spec.id)}"><h3>${esc(spec.title)} ${chooser}</h3>
    <canvas width="900" height="180"></canvas><div class="legend">${legend(spec).join("")}</div>
    ${spec.note ? `<p>${esc(spec.note)}</p>` : ""}</div>`).join("");
  specs.forEach((spec, i) => drawChart($$("canvas", into)[i], spec.series.map(s => s[3](obj)), spec));
  for (const sel of $$("select.range", into)) sel.onchange = () => { state.range = Number(sel.value); store.setItem("roarmq-range", sel.value); state.update && state.update(); };
}

// One line a series over the range (left: its start, right: the newest sample), a dot at the
// newest point.
function drawChart(canvas, lines, spec) {
  canvas.width = canvas.clientWidth || canvas.width;  // as wide as it is shown: text not stretched
  const ctx = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 16;
  const times = lines.flat().map(p => p.t);
  const now = times.length ? Math.max(...times) : Date.now(), span = state.range * 1000;
  const top = Math.max(1, ...lines.flat().map(p => p.v));
  const x = p => w - 4 - ((now - p.t) / span) * (w - 8), y = v => h - pad - (v / top) * (h - 2 * pad);
  ctx.fillStyle = "#666";
  ctx.textAlign = "left";
  ctx.fillText((Number.isInteger(top) ? top : top.toFixed(1)) + spec.unit, 4, 12);
  ctx.fillText(span < 120000 ? `${Math.round(span / 1000)} s ago` : `${Math.round(span / 60000)} min ago`, 4, h - 4);
  ctx.textAlign = "right";
  ctx.fillText(times.length ? "now" : "no samples yet", w - 4, h - 4);
  spec.series.forEach(([, colour], i) => {
    const points = lines[i];
    if (!points.length) return;
    ctx.strokeStyle = ctx.fillStyle = colour;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((p, j) => (j ? ctx.lineTo(x(p), y(p.v)) : ctx.moveTo(x(p), y(p.v))));
    ctx.stroke();
    const last = points[points.length - 1];
    ctx.beginPath();
    ctx.arc(x(last), y(last.v), 3, 0, 2 * Math.PI);
    ctx.fill();
  });
}

const totals = pairs => `<div class="totals">${pairs.map(([k, v]) => `<div class="total" data-total="${esc(k)}"><b>${esc(v)}</b>${esc(k)}</div>`).join("")}</div>`;

// A page's changing part, `#live`: drawn from what `load` fetches now, and again on each refresh.
async function live(load, draw) {
  const update = async () => {
    const data = await load(), box = $("#live");
    if (box && box.isConnected) draw(box, data);
  };
  await update();
  return update;
}

// -- pages -------------------------------------------------------------------------------

const queueColumns = () => [
  ...(state.vhost ? [] : [{ key: "vhost", title: "Virtual host", sort: "vhost" }]),
  { key: "name", title: "Name", sort: "name", html: r => link("queue", r) },
  { key: "type", title: "Type", sort: "type" },
  { key: "features", title: "Features", html: features },
  { key: "state", title: "State", value: r => r.idle_since ? "idle" : r.state },
  { key: "messages_ready", title: "Ready", sort: "messages_ready", cls: "num" },
  { key: "messages_unacknowledged", title: "Unacked", sort: "messages_unacknowledged", cls: "num" },
  { key: "messages", title: "Total", sort: "messages", cls: "num" },
  { key: "consumers", title: "Consumers", sort: "consumers", cls: "num" },
  { key: "incoming", title: "incoming", sort: rateSort("publish"), value: r => rateText(r, "publish"), cls: "num" },
  { key: "deliver_get", title: "deliver / get", sort: rateSort("deliver_get"), value: r => rateText(r, "deliver_get"), cls: "num" },
  { key: "ack", title: "ack", sort: rateSort("ack"), value: r => rateText(r, "ack"), cls: "num" },
];

const exchangeColumns = () => [
  ...(state.vhost ? [] : [{ key: "vhost", title: "Virtual host", sort: "vhost" }]),
  { key: "name", title: "Name", sort: "name", html: r => link("exchange", r) },
  { key: "type", title: "Type", sort: "type" },
  { key: "features", title: "Features", html: features },
  { key: "in", title: "Message rate in", sort: rateSort("publish_in"), value: r => rateText(r, "publish_in"), cls: "num" },
  { key: "out", title: "Message rate out", sort: rateSort("publish_out"), value: r => rateText(r, "publish_out"), cls: "num" },
  { key: "delayed", title: "Delayed (next due)", value: delayedText, cls: "num" },
];

// A delayed exchange's held messages and when the next is due (UTC); empty for the others.
const delayedText = r => r.messages_delayed === undefined ? "" : `${r.messages_delayed}` +
  (r.messages_delayed_next_due ? ` (${new Date(r.messages_delayed_next_due).toISOString().slice(0, 19).replace("T", " ")})` : "");

const bindingColumns = (unbind, from = true, to = true) => [
  ...(from ? [{ key: "source", title: "From", html: r => r.source ? link("exchange", { vhost: r.vhost, name: r.source }) : "(AMQP default)" }] : []),
  ...(to ? [{ key: "destination", title: "To", html: r => link(r.destination_type === "queue" ? "queue" : "exchange", { vhost: r.vhost, name: r.destination }) + (r.destination_type === "exchange" ? " <small>(exchange)</small>" : "") }] : []),
  { key: "routing_key", title: "Routing key" },
  { key: "arguments", title: "Arguments", html: r => kvTable(r.arguments, "") },
  ...(unbind ? [{ key: "x", title: "", html: r => r.source ? `<button class="unbind" data-binding="${esc(bindingPath(r))}">Unbind</button>` : "" }] : []),
];
const bindingPath = r => `/bindings/${enc(r.vhost)}/e/${enc(r.source)}/${r.destination_type === "queue" ? "q" : "e"}/${enc(r.destination)}/${enc(r.properties_key)}`;

function bindUnbind(root, update) {
  for (const b of $$("button.unbind", root)) {
    dangerous(b, "Remove this binding?", async () => { await api("DELETE", b.dataset.binding); await update(); });
  }
}

const pages = {
  async ""() {
    $("#view").innerHTML = `<h2>Overview</h2><div id="live"></div>`;
    return live(() => api("GET", "/overview?" + ranged()), (box, o) => {
      const t = o.object_totals, q = o.queue_totals, m = o.message_stats || {};
      box.innerHTML = totals([["Connections", t.connections], ["Channels", t.channels], ["Exchanges", t.exchanges], ["Queues", t.queues],
          ["Consumers", t.consumers], ["Messages", q.messages], ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged]])
        + `<div class="charts"></div><div class="card"><h3>Node</h3><p>${esc(o.product_name)} ${esc(o.product_version)} on ${esc(o.node)} ·
          memory ${esc(size(o.mem_used))} of ${esc(size(o.mem_limit))} · disk free ${esc(size(o.disk_free))} (limit ${esc(size(o.disk_free_limit))}) ·
          alarms: ${alarmText(o)}</p>
          <p>Listeners: ${listenerText(o.listeners)}</p></div>`;
      showCharts($(".charts", box), o, [depthChart(o => o.queue_totals),
        rateChart([["publish", BLUE, "publish"], ["deliver/get", GREEN, "deliver_get"], ["ack", ORANGE, "ack"]],
          `Totals: published ${m.publish}, delivered ${m.deliver_get}, acked ${m.ack}, confirmed ${m.confirm}, `
          + `returned ${m.return_unroutable}, dropped unroutable ${m.drop_unroutable}.`)]);
    });
  },
  async connections() {
    $("#view").innerHTML = `<h2>Connections</h2><div id="rows"></div>`;
    return pagedList($("#rows"), { id: "connections", path: "/connections", vhostScoped: false, columns: [
      { key: "name", title: "Name", sort: "name" }, { key: "vhost", title: "Virtual host", sort: "vhost" }, { key: "user", title: "User", sort: "user" },
      { key: "state", title: "State", sort: "state" }, { key: "ssl", title: "TLS", sort: "ssl" }, { key: "channels", title: "Channels", sort: "channels", cls: "num" },
      { key: "recv", title: "From client", value: r => r.recv_oct_details ? `${size(r.recv_oct_details.rate)}/s` : "", cls: "num" },
      { key: "send", title: "To client", value: r => r.send_oct_details ? `${size(r.send_oct_details.rate)}/s` : "", cls: "num" },
      { key: "close", title: "", html: r => `<button class="close-conn" data-name="${esc(r.name)}">Close</button>` },
    ], bind: box => {
      for (const b of $$(".close-conn", box)) {
        dangerous(b, `Close connection ${b.dataset.name}?`, async () => {
          await api("DELETE", "/connections/" + enc(b.dataset.name), undefined, { "X-Reason": "Closed via the management console" });
          await state.update();
        });
      }
    } });
  },
  async streams() {
    // The stream protocol's clients (port 5552): connections, publishers, consumers.
    $("#view").innerHTML = `<h2>Stream connections</h2><div id="live"></div>`;
    const load = () => Promise.all(["connections", "publishers", "consumers"].map(k => api("GET", "/stream/" + k)));
    return live(load, (box, [conns, pubs, subs]) => {
      box.innerHTML = table(conns, [
        { key: "name", title: "Name" }, { key: "vhost", title: "Virtual host" }, { key: "user", title: "User" },
        { key: "state", title: "State" }, { key: "ssl", title: "TLS" },
        { key: "publishers", title: "Publishers", cls: "num" }, { key: "consumers", title: "Consumers", cls: "num" },
        { key: "close", title: "", html: r => `<button class="close-stream" data-vhost="${esc(r.vhost)}" data-name="${esc(r.name)}">Close</button>` },
      ]) + `<h3>Publishers</h3>` + table(pubs, [
        { key: "connection", title: "Connection", value: r => r.connection_details.name },
        { key: "publisher_id", title: "Id", cls: "num" }, { key: "reference", title: "Reference" },
        { key: "stream", title: "Stream", value: r => r.queue.name },
        { key: "published", title: "Published", cls: "num" }, { key: "confirmed", title: "Confirmed", cls: "num" },
        { key: "errored", title: "Errored", cls: "num" },
      ]) + `<h3>Consumers</h3>` + table(subs, [
        { key: "connection", title: "Connection", value: r => r.connection_details.name },
        { key: "subscription_id", title: "Id", cls: "num" }, { key: "stream", title: "Stream", value: r => r.queue.name },
        { key: "offset", title: "Offset", cls: "num" }, { key: "offset_lag", title: "Lag", cls: "num" },
        { key: "credits", title: "Credits", cls: "num" }, { key: "consumed", title: "Consumed", cls: "num" },
        { key: "activity_status", title: "Status" },
      ]);
      for (const b of $$(".close-stream", box)) {
        dangerous(b, `Close stream connection ${b.dataset.name}?`, async () => {
          await api("DELETE", "/stream/connections/" + enc(b.dataset.vhost) + "/" + enc(b.dataset.name));
          await state.update();
        });
      }
    });
  },
  async channels() {
    $("#view").innerHTML = `<h2>Channels</h2><div id="rows"></div>`;
    return pagedList($("#rows"), { id: "channels", path: "/channels", vhostScoped: false, columns: [
      { key: "name", title: "Channel", sort: "name" }, { key: "vhost", title: "Virtual host", sort: "vhost" }, { key: "user", title: "User", sort: "user" },
      { key: "mode", title: "Mode", value: r => [r.confirm ? "C" : "", r.transactional ? "T" : ""].join("") },
      { key: "state", title: "State", value: r => r.idle_since ? "idle" : r.state },
      { key: "consumer_count", title: "Consumers", sort: "consumer_count", cls: "num" },
      { key: "messages_unacknowledged", title: "Unacked", sort: "messages_unacknowledged", cls: "num" },
      { key: "prefetch_count", title: "Prefetch", sort: "prefetch_count", cls: "num" },
      { key: "publish", title: "publish", value: r => rateText(r, "publish"), cls: "num" },
      { key: "deliver_get", title: "deliver / get", value: r => rateText(r, "deliver_get"), cls: "num" },
      { key: "ack", title: "ack", value: r => rateText(r, "ack"), cls: "num" },
    ] });
  },
  async exchanges() {
    const [cat, types, vhosts] = await Promise.all([catalogue(), api("GET", "/overview?columns=exchange_types"), vhostOptions()]);
    $("#view").innerHTML = `<h2>Exchanges</h2><div id="rows"></div>
      <details class="card" id="add-exchange-card"><summary><h3>Add a new exchange</h3></summary><form id="add-exchange">
        <label>Virtual host <select name="vhost">${vhosts}</select></label>
        <label>Name <input name="name" required></label>
        <label>Type <select name="type">${types.exchange_types.map(t => `<option value="${esc(t.name)}">${esc(t.name)}</option>`).join("")}</select></label>
        <label>Durability <select name="durable"><option value="true">Durable</option><option value="false">Transient</option></select></label>
        <label>Auto delete ${yesNo("auto_delete")}</label><label>Internal ${yesNo("internal")}</label>
        <label>Arguments</label>${argsEditor("arguments", cat.exchange)}
        <button>Add exchange</button></form></details>`;
    const form = $("#add-exchange");
    bindArgs(form);
    const type = () => filterArgLinks(form, form.type.value);
    form.type.onchange = type;
    type();
    form.onsubmit = submit(async f => {
      await api("PUT", `/exchanges/${enc(f.vhost.value)}/${enc(f.name.value)}`, {
        type: f.type.value, durable: f.durable.value === "true", auto_delete: f.auto_delete.value === "true",
        internal: f.internal.value === "true", arguments: readArgs(f, "arguments") });
      f.insertAdjacentHTML("beforeend", `<p class="ok">Exchange ${esc(f.name.value)} added.</p>`);
      f.name.value = "";
      await state.update();
    }, false);
    return pagedList($("#rows"), { id: "exchanges", path: "/exchanges", columns: exchangeColumns() });
  },
  async queues() {
    const [cat, vhosts] = await Promise.all([catalogue(), vhostOptions()]);
    $("#view").innerHTML = `<h2>Queues</h2><div id="rows"></div>
      <details class="card" id="add-queue-card"><summary><h3>Add a new queue</h3></summary><form id="add-queue">
        <label>Virtual host <select name="vhost">${vhosts}</select></label>
        <label>Type <select name="type">${cat.queue_types.map(t => `<option value="${esc(t)}" ${t === cat.default_queue_type ? "selected" : ""}>${esc(t[0].toUpperCase() + t.slice(1))}</option>`).join("")}</select></label>
        <label>Name <input name="name" required></label>
        <label>Durability <select name="durable"><option value="true">Durable</option><option value="false">Transient</option></select></label>
        <label>Auto delete ${yesNo("auto_delete")}</label>
        <label>Arguments</label>${argsEditor("arguments", cat.queue.filter(a => a.argument !== "x-queue-type"))}
        <button>Add queue</button></form></details>`;
    const form = $("#add-queue");
    bindArgs(form);
    const type = () => {
      filterArgLinks(form, form.type.value);
      const replicated = form.type.value !== "classic";  // quorum and stream queues are durable, never auto-delete
      if (replicated) { form.durable.value = "true"; form.auto_delete.value = "false"; }
      form.durable.disabled = form.auto_delete.disabled = replicated;
    };
    form.type.onchange = type;
    type();
    form.onsubmit = submit(async f => {
      const body = { durable: f.durable.value === "true", auto_delete: f.auto_delete.value === "true", arguments: readArgs(f, "arguments") };
      if (f.type.value !== cat.default_queue_type) body.arguments["x-queue-type"] = f.type.value;
      await api("PUT", `/queues/${enc(f.vhost.value)}/${enc(f.name.value)}`, body);
      f.insertAdjacentHTML("beforeend", `<p class="ok">Queue ${esc(f.name.value)} added.</p>`);
      f.name.value = "";
      await state.update();
    }, false);
    return pagedList($("#rows"), { id: "queues", path: "/queues", columns: queueColumns() });
  },
  async bindings() {
    $("#view").innerHTML = `<h2>Bindings</h2><div id="rows"></div>`;
    return pagedList($("#rows"), { id: "bindings", path: "/bindings", sort: "source", columns: [
      ...(state.vhost ? [] : [{ key: "vhost", title: "Virtual host", sort: "vhost" }]),
      ...bindingColumns(true).map(c => ({ ...c, sort: ["source", "destination", "routing_key"].includes(c.key) ? c.key : undefined })),
    ], bind: box => bindUnbind(box, () => state.update()) });
  },
  async users() {
    $("#view").innerHTML = `<h2>Users</h2><div id="rows"></div>
      <form class="card" id="add-user"><h3>Add a user</h3><label>Name <input name="name" required></label>
         <label>Password <input name="password" type="password" required></label><label>Tags <input name="tags" placeholder="administrator, monitoring"></label>
         <button>Add user</button></form>` + (await grantCard(GRANTS[0])) + (await grantCard(GRANTS[1]));
    $("#add-user").onsubmit = submit(async f => api("PUT", "/users/" + enc(f.name.value), { password: f.password.value, tags: f.tags.value }));
    GRANTS.forEach(bindGrantCard);
    return pagedList($("#rows"), { id: "users", path: "/users", vhostScoped: false, columns: [
      { key: "name", title: "Name", sort: "name" }, { key: "tags", title: "Tags", value: r => [].concat(r.tags).join(", ") },
      { key: "x", title: "", html: r => state.me && r.name === state.me.name ? `<span class="muted">(you)</span>` : `<button class="del-user" data-name="${esc(r.name)}">Delete</button>` },
    ], bind: box => {
      for (const b of $$(".del-user", box)) dangerous(b, `Delete user ${b.dataset.name}?`, async () => { await api("DELETE", "/users/" + enc(b.dataset.name)); await route(); });
    } });
  },
  async vhosts() {
    $("#view").innerHTML = `<h2>Virtual hosts</h2><div id="rows"></div>
      <form class="card" id="add-vhost"><h3>Add a virtual host</h3><label>Name <input name="name" required></label>
      <label>Description <input name="description"></label><button>Add virtual host</button></form>`;
    $("#add-vhost").onsubmit = submit(async f => { await api("PUT", "/vhosts/" + enc(f.name.value), { description: f.description.value }); state.vhosts = null; vhostChooser(); });
    return pagedList($("#rows"), { id: "vhosts", path: "/vhosts", vhostScoped: false, columns: [
      { key: "name", title: "Name", sort: "name" }, { key: "description", title: "Description" },
      { key: "messages_ready", title: "Ready", sort: "messages_ready", cls: "num" }, { key: "messages_unacknowledged", title: "Unacked", sort: "messages_unacknowledged", cls: "num" },
      { key: "messages", title: "Total", sort: "messages", cls: "num" },
      { key: "x", title: "", html: r => `<button class="del-vhost" data-name="${esc(r.name)}">Delete</button>` },
    ], bind: box => {
      for (const b of $$(".del-vhost", box)) {
        dangerous(b, `Delete virtual host ${b.dataset.name} and everything in it?`, async () => { await api("DELETE", "/vhosts/" + enc(b.dataset.name)); state.vhosts = null; vhostChooser(); await route(); });
      }
    } });
  },
  async policies() {
    const [cat, vhosts] = await Promise.all([catalogue(), vhostOptions()]);
    const keys = [...cat.queue, ...cat.exchange].filter(a => a.policy_key);
    $("#view").innerHTML = `<h2>Policies</h2><div id="rows"></div>
      <form class="card" id="add-policy"><h3>Add / update a policy</h3>
      <label>Virtual host <select name="vhost">${vhosts}</select></label><label>Name <input name="name" required></label>
      <label>Pattern <input name="pattern" required value="^"></label>
      <label>Apply to <select name="applyto"><option value="all">Exchanges and queues</option><option value="queues">Queues</option><option value="exchanges">Exchanges</option></select></label>
      <label>Priority <input name="priority" type="number" value="0"></label>
      <label>Definition</label>${argsEditor("definition", keys, a => a.policy_key)}<button>Add / update policy</button></form>`;
    bindArgs($("#add-policy"));
    $("#add-policy").onsubmit = submit(async f => api("PUT", `/policies/${enc(f.vhost.value)}/${enc(f.name.value)}`,
      { pattern: f.pattern.value, "apply-to": f.applyto.value, priority: Number(f.priority.value), definition: readArgs(f, "definition") }));
    return pagedList($("#rows"), { id: "policies", path: "/policies", columns: [
      ...(state.vhost ? [] : [{ key: "vhost", title: "Virtual host", sort: "vhost" }]),
      { key: "name", title: "Name", sort: "name" }, { key: "pattern", title: "Pattern", sort: "pattern" },
      { key: "apply-to", title: "Apply to", sort: "apply-to" }, { key: "definition", title: "Definition", html: r => kvTable(r.definition) },
      { key: "priority", title: "Priority", sort: "priority", cls: "num" },
      { key: "x", title: "", html: r => `<button class="del-policy" data-vhost="${esc(r.vhost)}" data-name="${esc(r.name)}">Delete</button>` },
    ], bind: box => {
      for (const b of $$(".del-policy", box)) {
        dangerous(b, `Delete policy ${b.dataset.name}?`, async () => { await api("DELETE", `/policies/${enc(b.dataset.vhost)}/${enc(b.dataset.name)}`); await state.update(); });
      }
    } });
  },
  async limits() {
    const vhosts = await vhostOptions();
    const limitOptions = names => names.map(n => `<option value="${n}">${n}</option>`).join("");
    $("#view").innerHTML = `<h2>Limits</h2><div id="live"></div>
      <form class="card" id="set-vhost-limit"><h3>Set a virtual host limit</h3>
        <label>Virtual host <select name="vhost">${vhosts}</select></label>
        <label>Limit <select name="limit">${limitOptions(LIMITS.vhost)}</select></label>
        <label>Value <input name="value" type="number" step="1" required></label><button>Set limit</button></form>
      <form class="card" id="set-user-limit"><h3>Set a user limit</h3>
        <label>User <input name="user" required></label>
        <label>Limit <select name="limit">${limitOptions(LIMITS.user)}</select></label>
        <label>Value <input name="value" type="number" step="1" required></label><button>Set limit</button></form>`;
    for (const kind of ["vhost", "user"]) {
      $(`#set-${kind}-limit`).onsubmit = submit(async f => {
        await api("PUT", `/${kind}-limits/${enc(f[kind].value)}/${enc(f.limit.value)}`, { value: Number(f.value.value) });
        f.value.value = "";
        await state.update();
      }, false);
    }
    return live(() => Promise.all([api("GET", "/vhost-limits"), api("GET", "/user-limits")]), (box, [vhostRows, userRows]) => {
      const card = (kind, title, rows) => {
        const flat = rows.flatMap(r => Object.entries(r.value).map(([limit, value]) => ({ owner: r[kind], limit, value })));
        return `<div class="card" id="${kind}-limits"><h3>${esc(title)}</h3>${table(flat, [
          { key: "owner", title: kind === "vhost" ? "Virtual host" : "User" }, { key: "limit", title: "Limit" },
          { key: "value", title: "Value", cls: "num" },
          { key: "x", title: "", html: r => `<button class="clear-limit" data-kind="${kind}" data-owner="${esc(r.owner)}" data-limit="${esc(r.limit)}">Clear</button>` },
        ])}</div>`;
      };
      box.innerHTML = card("vhost", "Virtual host limits", vhostRows) + card("user", "User limits", userRows);
      for (const b of $$(".clear-limit", box)) {
        const { kind, owner, limit } = b.dataset;
        dangerous(b, `Clear the ${limit} limit of ${kind === "vhost" ? "virtual host" : "user"} ${owner}?`,
          async () => { await api("DELETE", `/${kind}-limits/${enc(owner)}/${enc(limit)}`); await state.update(); });
      }
    });
  },
  async shovels() {
    // RabbitMQ's dynamic shovels: the parameters (component "shovel") and, per shovel, the
    // status row of the node running it; passwords appear in neither list's URIs.
    const vhosts = await vhostOptions();
    $("#view").innerHTML = `<h2>Shovels</h2><div id="live"></div>
      <form class="card" id="add-shovel"><h3>Add / update a shovel</h3>
        <label>Virtual host <select name="vhost">${vhosts}</select></label><label>Name <input name="name" required></label>
        <label>Source URI <input name="srcuri" value="amqp://" required></label>
        <label>Source <select name="srckind"><option value="queue">Queue</option><option value="exchange">Exchange</option></select></label>
        <label>Source name <input name="src"></label><label>Source routing key <input name="srckey" placeholder="(exchange only)"></label>
        <label>Destination URI <input name="desturi" value="amqp://" required></label>
        <label>Destination <select name="destkind"><option value="queue">Queue</option><option value="exchange">Exchange</option></select></label>
        <label>Destination name <input name="dest"></label><label>Destination routing key <input name="destkey" placeholder="(exchange only)"></label>
        <label>Acknowledgement <select name="ack"><option>on-confirm</option><option>on-publish</option><option>no-ack</option></select></label>
        <label>Prefetch <input name="prefetch" type="number" value="1000"></label>
        <label>Delete after <select name="after"><option>never</option><option>queue-length</option></select></label>
        <label>Reconnect delay (s) <input name="delay" type="number" value="5"></label>
        <button>Add / update shovel</button></form>`;
    $("#add-shovel").onsubmit = submit(async f => {
      const value = { "src-uri": f.srcuri.value, "dest-uri": f.desturi.value, "ack-mode": f.ack.value,
        "src-prefetch-count": Number(f.prefetch.value), "src-delete-after": f.after.value, "reconnect-delay": Number(f.delay.value) };
      value[`src-${f.srckind.value}`] = f.src.value;
      if (f.srckind.value === "exchange") value["src-exchange-key"] = f.srckey.value || "#";
      if (f.dest.value) value[`dest-${f.destkind.value}`] = f.dest.value;
      if (f.destkind.value === "exchange" && f.destkey.value) value["dest-exchange-key"] = f.destkey.value;
      return api("PUT", `/parameters/shovel/${enc(f.vhost.value)}/${enc(f.name.value)}`, { value });
    });
    return live(() => Promise.all([api("GET", "/parameters/shovel"), api("GET", "/shovels")]), (box, [params, rows]) => {
      const status = Object.fromEntries(rows.map(r => [`${r.vhost}\u0000${r.name}`, r]));
      const shown = params.filter(p => !state.vhost || p.vhost === state.vhost).map(p => ({ ...p, status: status[`${p.vhost}\u0000${p.name}`] }));
      box.innerHTML = `<div class="card" id="shovel-rows">${table(shown, [
        { key: "vhost", title: "Virtual host" }, { key: "name", title: "Name" },
        { key: "state", title: "State", html: r => r.status ? esc(r.status.state) + (r.status.reason ? ` <span class="muted">${esc(r.status.reason)}</span>` : "") : `<span class="muted">(not on this node)</span>` },
        { key: "src", title: "Source", value: r => (r.status && r.status.src_uri) || "" },
        { key: "from", title: "From", value: r => r.value["src-queue"] !== undefined ? `queue ${r.value["src-queue"]}` : `exchange ${r.value["src-exchange"]}` },
        { key: "dest", title: "Destination", value: r => (r.status && r.status.dest_uri) || "" },
        { key: "to", title: "To", value: r => r.value["dest-queue"] !== undefined ? `queue ${r.value["dest-queue"]}` : `exchange ${r.value["dest-exchange"] || "(the message's)"}` },
        { key: "x", title: "", html: r => `<button class="restart-shovel" data-vhost="${esc(r.vhost)}" data-name="${esc(r.name)}">Restart</button> <button class="del-shovel" data-vhost="${esc(r.vhost)}" data-name="${esc(r.name)}">Delete</button>` },
      ])}</div>`;
      for (const b of $$(".restart-shovel", box)) b.onclick = async () => { await api("DELETE", `/shovels/vhost/${enc(b.dataset.vhost)}/${enc(b.dataset.name)}/restart`); await state.update(); };
      for (const b of $$(".del-shovel", box)) {
        dangerous(b, `Delete shovel ${b.dataset.name}?`, async () => { await api("DELETE", `/parameters/shovel/${enc(b.dataset.vhost)}/${enc(b.dataset.name)}`); await state.update(); });
      }
    });
  },
  async federation() {
    // RabbitMQ's federation: upstreams (component "federation-upstream") and the links the
    // policies with federation-upstream(-set) make, each with its status.
    const vhosts = await vhostOptions();
    $("#view").innerHTML = `<h2>Federation</h2><div id="live"></div>
      <form class="card" id="add-upstream"><h3>Add / update an upstream</h3>
        <label>Virtual host <select name="vhost">${vhosts}</select></label><label>Name <input name="name" required></label>
        <label>URI <input name="uri" required placeholder="amqp://user:password@host"></label>
        <label>Exchange <input name="exchange" placeholder="(the federated one's name)"></label>
        <label>Max hops <input name="hops" type="number" value="1"></label>
        <label>Expires (ms) <input name="expires" type="number"></label>
        <button>Add / update upstream</button></form>
      <p class="muted">A policy with <code>federation-upstream-set</code> (a set's name, or <code>all</code>) or
        <code>federation-upstream</code> federates the exchanges or queues it matches (Policies page).</p>`;
    $("#add-upstream").onsubmit = submit(async f => {
      const value = { uri: f.uri.value, "max-hops": Number(f.hops.value) };
      if (f.exchange.value) value.exchange = f.exchange.value;
      if (f.expires.value) value.expires = Number(f.expires.value);
      return api("PUT", `/parameters/federation-upstream/${enc(f.vhost.value)}/${enc(f.name.value)}`, { value });
    });
    return live(() => Promise.all([api("GET", "/parameters/federation-upstream"), api("GET", "/federation-links")]), (box, [ups, links]) => {
      const mine = rows => rows.filter(r => !state.vhost || r.vhost === state.vhost);
      box.innerHTML = `<div class="card" id="upstream-rows"><h3>Upstreams</h3>${table(mine(ups), [
        { key: "vhost", title: "Virtual host" }, { key: "name", title: "Name" },
        { key: "uri", title: "URI", value: r => [].concat(r.value.uri).map(u => u.replace(/\/\/[^@/]*@/, "//")).join(", ") },
        { key: "x", title: "", html: r => `<button class="del-upstream" data-vhost="${esc(r.vhost)}" data-name="${esc(r.name)}">Delete</button>` },
      ])}</div><div class="card" id="link-rows"><h3>Links</h3>${table(mine(links), [
        { key: "vhost", title: "Virtual host" }, { key: "type", title: "Type" },
        { key: "name", title: "Federated", value: r => r.exchange || r.queue },
        { key: "upstream", title: "Upstream" },
        { key: "status", title: "Status", html: r => esc(r.status) + (r.error ? ` <span class="muted">${esc(r.error)}</span>` : "") },
        { key: "uri", title: "URI" }, { key: "timestamp", title: "Since" },
      ])}</div>`;
      for (const b of $$(".del-upstream", box)) {
        dangerous(b, `Delete upstream ${b.dataset.name}?`, async () => { await api("DELETE", `/parameters/federation-upstream/${enc(b.dataset.vhost)}/${enc(b.dataset.name)}`); await state.update(); });
      }
    });
  },
  async definitions() {
    $("#view").innerHTML = `<h2>Definitions</h2><div class="card"><h3>Export</h3><button id="download">Download definitions.json</button></div>
      <form class="card" id="upload"><h3>Import</h3><input type="file" name="file" accept=".json" required> <button>Upload</button></form>`;
    $("#download").onclick = async () => {
      const doc = await api("GET", "/definitions");
      const a = document.createElement("a");
      a.href = URL.createObjectURL(new Blob([JSON.stringify(doc, null, 2)], { type: "application/json" }));
      a.download = "definitions.json";
      a.click();
    };
    $("#upload").onsubmit = submit(async f => api("POST", "/definitions", JSON.parse(await f.file.files[0].text())));
  },
  async queue(vhost, name) {
    const base = `/queues/${enc(vhost)}/${enc(name)}`;
    const [cat, first] = await Promise.all([catalogue(), api("GET", base)]);
    // A stream (as RabbitMQ's UI shows one): retained messages, segments and offsets, each
    // consumer's offset; no get, move or purge (a stream refuses them).
    const stream = first.type === "stream";
    $("#view").innerHTML = `<h2>${stream ? "Stream" : "Queue"} ${esc(name)} <small>in ${esc(vhost)}</small></h2><div id="live"></div>
      <div class="card" id="bindings-card"><h3>Bindings</h3><div id="bindings"></div>
        <form id="bind"><h4>Add binding to this queue</h4><label>From exchange <input name="source" required></label>
        <label>Routing key <input name="key"></label><label>Arguments</label>${argsEditor("arguments")}<button>Bind</button></form></div>
      ${stream ? `${publishForm("Publish message", false)}<div class="card" id="danger"><h3>Delete</h3><p class="muted">A stream's messages stay until its retention
        (x-max-length-bytes, x-max-age) removes whole segments: they cannot be got, moved or purged.</p><button id="delete" class="danger">Delete stream</button></div>` : `
      <form class="card" id="get"><h3>Get messages</h3><p class="muted">Getting messages is destructive with "Ack": they leave the queue.</p>
        <label>Ack mode <select name="ackmode"><option value="ack_requeue_true">Nack message requeue true</option><option value="ack_requeue_false">Automatic ack</option>
        <option value="reject_requeue_true">Reject requeue true</option><option value="reject_requeue_false">Reject requeue false (dead-letter)</option></select></label>
        <label>Encoding <select name="encoding"><option value="auto">Auto string / base64</option><option value="base64">base64</option></select></label>
        <label>Messages <input name="count" type="number" value="1" min="1"></label><button>Get Message(s)</button><div id="got"></div></form>
      ${publishForm("Publish message", false)}
      <form class="card" id="move"><h3>Move messages</h3><p class="muted">Moves the queue's messages, from its head, to another queue of this virtual host
        (RabbitMQ does this with a shovel; RoarMQ takes and republishes them itself, each acknowledged once the destination has it).</p>
        <label>Destination queue <input name="destination" required></label><label>At most <input name="count" type="number" min="1" placeholder="all"></label>
        <button>Move messages</button></form>
      <div class="card" id="danger"><h3>Delete / purge</h3><button id="delete" class="danger">Delete queue</button> <button id="purge" class="danger">Purge messages</button></div>`}`;
    const drawBindings = async () => {
      const rows = await api("GET", base + "/bindings");
      const box = $("#bindings");
      if (!box) return;
      box.innerHTML = table(rows, bindingColumns(true, true, false));
      bindUnbind(box, drawBindings);
    };
    const update = await live(() => api("GET", `${base}?${ranged()}`), (box, q) => stream ? drawStream(box, q) : drawQueue(box, q));
    function drawStream(box, q) {
      const lastOffset = q.last_offset < 0 ? "(empty)" : q.last_offset;
      box.innerHTML = totals([["Messages", q.messages], ["Segments", q.segments], ["First offset", q.first_offset], ["Last offset", lastOffset], ["Consumers", q.consumers]])
        + `<div class="charts"></div><div class="card" id="details"><h3>Details</h3><table class="kv">
          <tr><th>Type</th><td>stream</td></tr><tr><th>Features</th><td>${features(q) || "(none)"}</td></tr>
          <tr><th>Policy</th><td>${esc(q.policy || "")}</td></tr><tr><th>Operator policy</th><td>${esc(q.operator_policy || "")}</td></tr>
          <tr><th>Effective policy definition</th><td>${kvTable(q.effective_policy_definition)}</td></tr>
          <tr><th>Arguments</th><td id="arguments">${kvTable(q.arguments)}</td></tr>
          <tr><th>Retained</th><td>${esc(q.messages)} messages · ${esc(size(q.message_bytes))} in ${esc(q.segments)} segment(s) on disk · offsets ${esc(q.first_offset)} to ${esc(lastOffset)}</td></tr>
          <tr><th>Filtering</th><td>${esc(q.filter_chunks_skipped)} chunk(s) skipped for filtered consumers</td></tr>
          <tr><th>Leader</th><td>${esc(q.leader || q.node)}</td></tr><tr><th>Members</th><td>${esc((q.members || []).join(", "))}</td></tr>
          <tr><th>Online</th><td>${esc((q.online || []).join(", "))}</td></tr></table></div>
          <div class="card"><h3>Consumers</h3>${table(q.consumer_details, [{ key: "channel", title: "Channel", value: r => r.channel_details.name },
            { key: "consumer_tag", title: "Consumer tag" }, { key: "offset", title: "Next offset", cls: "num" }, { key: "offset_lag", title: "Offset lag", cls: "num" },
            { key: "prefetch_count", title: "Prefetch count" }, { key: "arguments", title: "Arguments", html: r => kvTable(r.arguments, "") }])}</div>`;
      showCharts($(".charts", box), q, [{ id: "messages", title: "Retained messages", unit: "",
        series: [["messages", GREY, o => o.messages, o => samples(o.messages_details)]] },
        rateChart([["publish", BLUE, "publish"], ["deliver", GREEN, "deliver_get"], ["ack", ORANGE, "ack"]])]);
    }
    function drawQueue(box, q) {
      box.innerHTML = totals([["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged], ["Total", q.messages], ["Consumers", q.consumers]])
        + `<div class="charts"></div><div class="card" id="details"><h3>Details</h3><table class="kv">
          <tr><th>Type</th><td>${esc(q.type)}</td></tr><tr><th>Features</th><td>${features(q) || "(none)"}</td></tr>
          <tr><th>State</th><td>${esc(q.idle_since ? "idle since " + q.idle_since : q.state)}</td></tr>
          <tr><th>Policy</th><td>${esc(q.policy || "")}</td></tr><tr><th>Operator policy</th><td>${esc(q.operator_policy || "")}</td></tr>
          <tr><th>Effective policy definition</th><td>${kvTable(q.effective_policy_definition)}</td></tr>
          <tr><th>Arguments</th><td id="arguments">${kvTable(q.arguments)}</td></tr>
          <tr><th>Consumers</th><td>${esc(q.consumers)} · utilisation ${esc(Math.round((q.consumer_utilisation || 0) * 100))}%</td></tr>
          <tr><th>Bytes</th><td>${esc(size(q.message_bytes))} (ready ${esc(size(q.message_bytes_ready))}, unacked ${esc(size(q.message_bytes_unacknowledged))}) · in memory ${esc(size(q.memory))}</td></tr>
          <tr><th>Node</th><td>${esc(q.node)}</td></tr></table></div>
          <div class="card"><h3>Consumers</h3>${table(q.consumer_details, [{ key: "channel", title: "Channel", value: r => r.channel_details.name },
            { key: "consumer_tag", title: "Consumer tag" }, { key: "ack_required", title: "Ack required" }, { key: "exclusive", title: "Exclusive" },
            { key: "prefetch_count", title: "Prefetch count" }, { key: "arguments", title: "Arguments", html: r => kvTable(r.arguments, "") }])}</div>`;
      showCharts($(".charts", box), q, [depthChart(q => q),
        rateChart([["publish", BLUE, "publish"], ["deliver/get", GREEN, "deliver_get"], ["ack", ORANGE, "ack"], ["redelivered", PURPLE, "redeliver"]])]);
    }
    await drawBindings();
    bindArgs($("#view"));
    $("#bind").onsubmit = submit(async f => {
      await api("POST", `/bindings/${enc(vhost)}/e/${enc(f.source.value)}/q/${enc(name)}`, { routing_key: f.key.value, arguments: readArgs(f, "arguments") });
      f.source.value = f.key.value = "";
      await drawBindings();
    }, false);
    bindPublish(vhost, "amq.default", () => name);
    dangerous($("#delete"), `Delete ${stream ? "stream" : "queue"} ${name}? Its messages go with it.`, async () => { await api("DELETE", base); location.hash = "#/queues"; });
    if (stream) return all([update, drawBindings]);
    $("#get").onsubmit = submit(async f => {
      const msgs = await api("POST", base + "/get", { count: Number(f.count.value), ackmode: f.ackmode.value, encoding: f.encoding.value, truncate: 50000 });
      $("#got").innerHTML = msgs.map((m, i) => `<div class="message"><h4>Message ${i + 1}</h4><p class="muted">The server reported ${esc(m.message_count)} messages remaining.</p>
        <table class="kv"><tr><th>Exchange</th><td>${esc(m.exchange || "(AMQP default)")}</td></tr><tr><th>Routing key</th><td>${esc(m.routing_key)}</td></tr>
        <tr><th>Redelivered</th><td>${esc(m.redelivered)}</td></tr><tr><th>Properties</th><td>${kvTable(m.properties)}</td></tr>
        <tr><th>Payload <small>${esc(m.payload_bytes)} bytes, ${esc(m.payload_encoding)}</small></th><td><pre class="payload">${esc(m.payload)}</pre></td></tr></table></div>`).join("")
        || "<p>Queue is empty</p>";
      await update();
    }, false);
    $("#move").onsubmit = submit(async f => {
      const body = { destination: f.destination.value };
      if (f.count.value) body.count = Number(f.count.value);
      const r = await api("POST", base + "/move", body);
      f.insertAdjacentHTML("beforeend", `<p class="ok">Moved ${esc(r.moved)} message(s) to ${esc(f.destination.value)}.</p>`);
      await update();
    }, false);
    dangerous($("#purge"), `Purge all messages of queue ${name}?`, async () => { await api("DELETE", base + "/contents"); await update(); });
    return all([update, drawBindings]);
  },
  async exchange(vhost, name) {
    const base = `/exchanges/${enc(vhost)}/${enc(name)}`;
    const builtin = name === "amq.default" || name.startsWith("amq.");
    $("#view").innerHTML = `<h2>Exchange ${esc(name === "amq.default" ? "(AMQP default)" : name)} <small>in ${esc(vhost)}</small></h2><div id="live"></div>
      <div class="card" id="bindings-card"><h3>Bindings</h3><div id="bindings"></div>
        <form id="bind"><h4>Add binding from this exchange</h4>
        <label>To <select name="kind"><option value="q">To queue</option><option value="e">To exchange</option></select> <input name="destination" required></label>
        <label>Routing key <input name="key"></label><label>Arguments</label>${argsEditor("arguments")}<button>Bind</button></form></div>
      ${publishForm("Publish message", true)}
      <form class="card" id="explain"><h3>Route explain</h3><p>Where a message would go, and why, without publishing it.</p>
        <label>Routing key <input name="key"></label><label>Headers (JSON, optional) <input name="headers" placeholder='{"CC": ["other.key"]}'></label>
        <button>Explain</button><div id="explained"></div></form>
      ${builtin ? "" : `<div class="card" id="danger"><h3>Delete this exchange</h3><button id="delete" class="danger">Delete exchange</button></div>`}`;
    const drawBindings = async () => {
      if (name === "amq.default") { $("#bindings").innerHTML = `<p class="muted">The default exchange is bound to every queue by its name.</p>`; $("#bind").hidden = true; return; }
      const [out, into] = await Promise.all([api("GET", base + "/bindings/source"), api("GET", base + "/bindings/destination")]);
      const box = $("#bindings");
      if (!box) return;
      box.innerHTML = `<h4>This exchange → </h4>${table(out, bindingColumns(true, false, true))}<h4>→ This exchange</h4>${table(into, bindingColumns(true, true, false))}`;
      bindUnbind(box, drawBindings);
    };
    const update = await live(() => api("GET", `${base}?${ranged()}`), (box, x) => {
      box.innerHTML = `<div class="card" id="details"><h3>Details</h3><table class="kv">
          <tr><th>Type</th><td>${esc(x.type)}</td></tr><tr><th>Features</th><td>${features(x) || "(none)"}</td></tr>
          <tr><th>Durable</th><td>${esc(x.durable)}</td></tr><tr><th>Auto delete</th><td>${esc(x.auto_delete)}</td></tr><tr><th>Internal</th><td>${esc(x.internal)}</td></tr>
          <tr><th>Policy</th><td>${esc(x.policy || "")}</td></tr><tr><th>Arguments</th><td id="arguments">${kvTable(x.arguments)}</td></tr></table></div><div class="charts"></div>`;
      showCharts($(".charts", box), x, [rateChart([["publish in", BLUE, "publish_in"], ["publish out", PINK, "publish_out"]])]);
    });
    await drawBindings();
    bindArgs($("#view"));
    $("#bind").onsubmit = submit(async f => {
      await api("POST", `/bindings/${enc(vhost)}/e/${enc(name)}/${f.kind.value}/${enc(f.destination.value)}`, { routing_key: f.key.value, arguments: readArgs(f, "arguments") });
      f.destination.value = f.key.value = "";
      await drawBindings();
    }, false);
    bindPublish(vhost, name, f => f.key.value);
    $("#explain").onsubmit = submit(async f => {
      const body = { routing_key: f.key.value };
      if (f.headers.value) body.headers = JSON.parse(f.headers.value);
      const r = await api("POST", `/route/${enc(vhost)}/${enc(name)}`, body);
      $("#explained").innerHTML = `<p>Reaches <b>${r.queues.length}</b> queue(s): ${r.queues.map(esc).join(", ") || "(none)"}</p>`
        + table(r.bindings, [{ key: "source", title: "From" }, { key: "routing_key", title: "Binding key" }, { key: "destination", title: "To" }, { key: "destination_type", title: "Type" }])
        + r.notes.map(n => `<p>${esc(n)}</p>`).join("");
    }, false);
    if (!builtin) dangerous($("#delete"), `Delete exchange ${name}? Its bindings go with it.`, async () => { await api("DELETE", base); location.hash = "#/exchanges"; });
    return all([update, drawBindings]);
  },
};

// RabbitMQ's publish form: routing key (on an exchange's page), delivery mode, headers,
// properties, payload.
function publishForm(title, withKey) {
  return `<form class="card" id="publish"><h3>${esc(title)}</h3>${withKey ? `<label>Routing key <input name="key"></label>` : ""}
    <label>Delivery mode <select name="mode"><option value="1">1 - Non-persistent</option><option value="2">2 - Persistent</option></select></label>
    <label>Headers</label>${argsEditor("headers")}
    <label>Properties</label>${argsEditor("properties", ["content_type", "content_encoding", "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"]
      .map(p => ({ argument: p, label: p, type: ["priority", "timestamp"].includes(p) ? "number" : "string" })))}
    <label>Payload <textarea name="payload"></textarea></label><button>Publish message</button></form>`;
}

function bindPublish(vhost, exchange, key) {
  $("#publish").onsubmit = submit(async f => {
    const properties = { ...readArgs(f, "properties"), delivery_mode: Number(f.mode.value) };
    const headers = readArgs(f, "headers");
    if (Object.keys(headers).length) properties.headers = headers;
    const r = await api("POST", `/exchanges/${enc(vhost)}/${enc(exchange)}/publish`,
      { routing_key: key(f), payload: f.payload.value, payload_encoding: "string", properties });
    f.insertAdjacentHTML("beforeend", r.routed ? `<p class="ok">Message published.</p>` : `<p class="error">Message published, but not routed.</p>`);
    if (state.update) await state.update();
  }, false);
}

// What a user may do in a vhost, as the users page lists, sets and clears it: permissions (one
// per user and vhost) and topic permissions (one per user, vhost and topic exchange).
const GRANTS = [
  { path: "permissions", title: "Permissions", set: "Set permission", fields: [["configure", ".*"], ["write", ".*"], ["read", ".*"]] },
  { path: "topic-permissions", title: "Topic permissions", set: "Set topic permission", clearAll: "Clear all of this user in this vhost",
    fields: [["exchange", "amq.topic"], ["write", ".*"], ["read", ".*"]],
    about: `On a topic exchange, the routing keys a user may publish with (write) and bind with (read); {username} and
      {vhost} in them stand for the user's and the vhost's names. Without one on an exchange, a user may use any key there.` },
];
// The limits the API takes (RabbitMQ's, broker/management/definitions.py LIMIT_NAMES).
const LIMITS = { vhost: ["max-connections", "max-queues"], user: ["max-connections", "max-channels"] };
const capital = word => word[0].toUpperCase() + word.slice(1);
// The API path of one user's grant in a vhost (and, for a topic permission, on one exchange).
const grantPath = (grant, r) => `/${grant.path}/${enc(r.vhost)}/${enc(r.user)}` + (r.exchange === undefined ? "" : "/" + enc(r.exchange));

async function grantCard(grant) {
  const rows = await api("GET", "/" + grant.path);
  const columns = [["user"], ["vhost"], ...grant.fields].map(([key]) => ({ key, title: capital(key) }));
  columns.push({ key: "x", title: "", html: r => `<button type="button" data-clear="${esc(grantPath(grant, r))}">Clear</button>` });
  return `<form class="card" id="set-${grant.path}"><h3>${esc(grant.title)}</h3>${grant.about ? `<p>${esc(grant.about)}</p>` : ""}
    ${table(rows, columns)}<label>User <input name="user" required></label><label>Vhost <input name="vhost" value="/"></label>
    ${grant.fields.map(([key, value]) => `<label>${capital(key)} <input name="${key}" value="${esc(value)}"></label>`).join("")}
    <button>${esc(grant.set)}</button>${grant.clearAll ? ` <button type="button" data-clear-all>${esc(grant.clearAll)}</button>` : ""}</form>`;
}

function bindGrantCard(grant) {
  const form = $(`#set-${grant.path}`), who = f => ({ vhost: f.vhost.value, user: f.user.value });
  form.onsubmit = submit(f => api("PUT", grantPath(grant, who(f)), Object.fromEntries(grant.fields.map(([key]) => [key, f[key].value]))));
  for (const b of form.querySelectorAll("[data-clear]")) b.onclick = () => confirmed("Clear this permission?") && attempt(form, () => api("DELETE", b.dataset.clear));
  for (const b of form.querySelectorAll("[data-clear-all]")) b.onclick = () => confirmed("Clear all of this user's topic permissions in this vhost?") && attempt(form, f => api("DELETE", grantPath(grant, who(f))));
}

async function route() {
  clearInterval(state.timer);
  state.update = null;
  if (!state.auth) { logout(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = pages[parts[0] || ""];
  for (const a of $$("#nav a")) a.classList.toggle("active", a.getAttribute("href") === "#/" + (parts[0] || ""));
  if (!page) { $("#view").innerHTML = "<p>Not found.</p>"; return; }
  const shown = ++state.shown;
  let update;
  try { update = await page(...parts.slice(1)); } catch (err) {
    if (err.message !== "unauthorised") $("#view").innerHTML = `<p class="error">${esc(err.message)}</p>`;
  }
  if (shown !== state.shown) return;
  // A page returns how to update what changes on it: every few seconds, as the broker samples.
  state.update = typeof update === "function" ? update : null;
  arm();
}

refreshChooser();
window.addEventListener("hashchange", route);
if (state.auth) api("GET", "/whoami").then(me => { showWho(me); route(); }).catch(() => {});
else logout();
