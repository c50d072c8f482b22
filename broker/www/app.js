// RoarMQ's web UI: plain JS over the management API, no build step, nothing from a CDN.
"use strict";

const state = { auth: sessionStorage.getItem("roarmq-auth"), timer: null, shown: 0, charts: {} };
const $ = (sel, root = document) => root.querySelector(sel);
const enc = encodeURIComponent;
const size = n => n == null ? "?" : n >= 1 << 30 ? (n / (1 << 30)).toFixed(1) + " GiB" : n >= 1 << 20 ? (n / (1 << 20)).toFixed(1) + " MiB" : n + " B";


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
  const store = o.message_store || {};
  if (store.state === "failed") set.push("message store failed: " + store.error);
  return set.length ? `<span class="error">${esc(set.join("; "))}</span>` : "none";
}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function api(method, path, body) {
  const headers = { Authorization: "Basic " + state.auth, "X-Requested-With": "XMLHttpRequest" };
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
  $("#who").innerHTML = `${esc(me.name)} <button id="logout">Log out</button>`;
  $("#logout").onclick = () => logout();
}

function table(rows, columns, opts = {}) {
  const head = columns.map(c => `<th data-key="${esc(c.key)}" class="${opts.sort === c.key ? "sorted" + (opts.reverse ? " rev" : "") : ""}">${esc(c.title)}</th>`).join("");
  const body = rows.map(r => "<tr>" + columns.map(c => `<td>${c.html ? c.html(r) : esc(c.value ? c.value(r) : r[c.key])}</td>`).join("") + "</tr>").join("");
  return `<table><thead><tr>${head}</tr></thead><tbody>${body || `<tr><td colspan="${columns.length}">(none)</td></tr>`}</tbody></table>`;
}

// A paged, sorted, filtered list: the server does the work (?page=&sort=&name=), so a
// broker with 100k queues sends the browser one page.
function pagedList(title, path, columns, extra = "") {
  const view = { page: 1, sort: columns[0].key, reverse: false, name: "" };
  const render = async () => {
    const q = `?page=${view.page}&page_size=100&sort=${enc(view.sort)}&sort_reverse=${view.reverse}&name=${enc(view.name)}`;
    let data;
    try { data = await api("GET", path + q); } catch (err) { $("#view").innerHTML = `<p class="error">${esc(err.message)}</p>`; return; }
    $("#view").innerHTML = `<h2>${esc(title)}</h2>${extra}
      <div class="pager"><input id="filter" placeholder="Filter by name" value="${esc(view.name)}">
      <button id="prev" ${view.page <= 1 ? "disabled" : ""}>‹</button>
      <span>page ${data.page} of ${data.page_count} · ${data.filtered_count} of ${data.total_count}</span>
      <button id="next" ${view.page >= data.page_count ? "disabled" : ""}>›</button></div>
      ${table(data.items, columns, view)}`;
    $("#filter").onchange = e => { view.name = e.target.value; view.page = 1; render(); };
    $("#prev").onclick = () => { view.page--; render(); };
    $("#next").onclick = () => { view.page++; render(); };
    for (const th of document.querySelectorAll("th[data-key]")) {
      th.onclick = () => { view.reverse = view.sort === th.dataset.key ? !view.reverse : false; view.sort = th.dataset.key; render(); };
    }
    if (extra && view.afterRender) view.afterRender();
  };
  view.refresh = render;
  return view;
}

const link = (kind, r) => `<a href="#/${kind}/${enc(r.vhost)}/${enc(r.name || "amq.default")}">${esc(r.name || "(AMQP default)")}</a>`;
const rate = (r, key) => r.message_stats && r.message_stats[key + "_details"] ? r.message_stats[key + "_details"].rate : 0;

const pages = {
  async ""() {
    $("#view").innerHTML = `<h2>Overview</h2><div id="live"></div>`;
    return live(() => api("GET", "/overview"), (box, o) => {
      const t = o.object_totals, q = o.queue_totals, m = o.message_stats || {};
      box.innerHTML = totals([["Connections", t.connections], ["Channels", t.channels], ["Exchanges", t.exchanges], ["Queues", t.queues],
          ["Consumers", t.consumers], ["Messages", q.messages], ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged]])
        + `<div class="charts"></div><div class="card"><h3>Node</h3><p>${esc(o.product_name)} ${esc(o.product_version)} on ${esc(o.node)} ·
          memory ${esc(size(o.mem_used))} of ${esc(size(o.mem_limit))} · disk free ${esc(size(o.disk_free))} (limit ${esc(size(o.disk_free_limit))}) ·
          alarms: ${alarmText(o)}</p>
          <p>Listeners: ${listenerText(o.listeners)}</p></div>`;
      showCharts($(".charts", box), "overview", o, [depthChart(o => o.queue_totals),
        rateChart([["publish", BLUE, "publish"], ["deliver/get", GREEN, "deliver_get"], ["ack", ORANGE, "ack"]],
          `Totals: published ${m.publish}, delivered ${m.deliver_get}, acked ${m.ack}, confirmed ${m.confirm}, `
          + `returned ${m.return_unroutable}, dropped unroutable ${m.drop_unroutable}.`)]);
    });
  },
  async connections() {
    const rows = await api("GET", "/connections");
    $("#view").innerHTML = "<h2>Connections</h2>" + table(rows, [
      { key: "name", title: "Name" }, { key: "user", title: "User" }, { key: "vhost", title: "Vhost" },
      { key: "state", title: "State" }, { key: "channels", title: "Channels" }, { key: "ssl", title: "TLS" },
      { key: "close", title: "", html: r => `<button data-close="${esc(r.name)}">Close</button>` },
    ]);
    for (const b of document.querySelectorAll("[data-close]")) {
      b.onclick = async () => { await api("DELETE", "/connections/" + enc(b.dataset.close)); route(); };
    }
  },
  async channels() {
    const rows = await api("GET", "/channels");
    $("#view").innerHTML = "<h2>Channels</h2>" + table(rows, [
      { key: "name", title: "Channel" }, { key: "user", title: "User" }, { key: "vhost", title: "Vhost" },
      { key: "consumer_count", title: "Consumers" }, { key: "messages_unacknowledged", title: "Unacked" },
      { key: "prefetch_count", title: "Prefetch" }, { key: "confirm", title: "Confirm" },
    ]);
  },
  exchanges() {
    return pagedList("Exchanges", "/exchanges", [
      { key: "name", title: "Name", html: r => link("exchange", r) }, { key: "vhost", title: "Vhost" },
      { key: "type", title: "Type" }, { key: "durable", title: "Durable" }, { key: "policy", title: "Policy" },
      { key: "message_stats.publish_in", title: "In", value: r => (r.message_stats || {}).publish_in },
    ]).refresh();
  },
  queues() {
    return pagedList("Queues", "/queues", [
      { key: "name", title: "Name", html: r => link("queue", r) }, { key: "vhost", title: "Vhost" },
      { key: "type", title: "Type" }, { key: "messages_ready", title: "Ready" },
      { key: "messages_unacknowledged", title: "Unacked" }, { key: "messages", title: "Total" },
      { key: "consumers", title: "Consumers" }, { key: "policy", title: "Policy" },
      { key: "message_stats.publish", title: "Publish/s", value: r => rate(r, "publish") },
    ]).refresh();
  },
  bindings() {
    return pagedList("Bindings", "/bindings", [
      { key: "vhost", title: "Vhost" }, { key: "source", title: "From", value: r => r.source || "(AMQP default)" },
      { key: "routing_key", title: "Routing key" }, { key: "destination", title: "To" },
      { key: "destination_type", title: "Type" }, { key: "arguments", title: "Arguments", value: r => JSON.stringify(r.arguments) },
    ]).refresh();
  },
  async users() {
    const rows = await api("GET", "/users");
    $("#view").innerHTML = "<h2>Users</h2>" + table(rows, [{ key: "name", title: "Name" }, { key: "tags", title: "Tags", value: r => r.tags.join(", ") },
      { key: "x", title: "", html: r => `<button data-del-user="${esc(r.name)}">Delete</button>` }])
      + `<form class="card" id="add-user"><h3>Add a user</h3><label>Name <input name="name" required></label>
         <label>Password <input name="password" type="password" required></label><label>Tags <input name="tags" placeholder="administrator, monitoring"></label>
         <button>Add user</button></form>` + (await grantCard(GRANTS[0])) + (await grantCard(GRANTS[1]));
    $("#add-user").onsubmit = submit(async f => api("PUT", "/users/" + enc(f.name.value), { password: f.password.value, tags: f.tags.value }));
    for (const b of document.querySelectorAll("[data-del-user]")) {
      b.onclick = async () => { if (confirm(`Delete user ${b.dataset.delUser}?`)) { await api("DELETE", "/users/" + enc(b.dataset.delUser)); route(); } };
    }
    GRANTS.forEach(bindGrantCard);
  },
  async vhosts() {
    const rows = await api("GET", "/vhosts");
    $("#view").innerHTML = "<h2>Virtual hosts</h2>" + table(rows, [{ key: "name", title: "Name" }, { key: "messages", title: "Messages" },
      { key: "x", title: "", html: r => `<button data-del-vhost="${esc(r.name)}">Delete</button>` }])
      + `<form class="card" id="add-vhost"><h3>Add a vhost</h3><label>Name <input name="name" required></label><button>Add vhost</button></form>`;
    $("#add-vhost").onsubmit = submit(async f => api("PUT", "/vhosts/" + enc(f.name.value)));
    for (const b of document.querySelectorAll("[data-del-vhost]")) {
      b.onclick = async () => { if (confirm(`Delete vhost ${b.dataset.delVhost} and everything in it?`)) { await api("DELETE", "/vhosts/" + enc(b.dataset.delVhost)); route(); } };
    }
  },
  async policies() {
    const rows = await api("GET", "/policies");
    $("#view").innerHTML = "<h2>Policies</h2>" + table(rows, [
      { key: "vhost", title: "Vhost" }, { key: "name", title: "Name" }, { key: "pattern", title: "Pattern" },
      { key: "apply-to", title: "Apply to" }, { key: "definition", title: "Definition", value: r => JSON.stringify(r.definition) },
      { key: "priority", title: "Priority" },
      { key: "x", title: "", html: r => `<button data-del="${esc(r.vhost)}|${esc(r.name)}">Delete</button>` },
    ]) + `<form class="card" id="add-policy"><h3>Set a policy</h3>
      <label>Vhost <input name="vhost" value="/"></label><label>Name <input name="name" required></label>
      <label>Pattern <input name="pattern" required value="^"></label>
      <label>Apply to <select name="applyto"><option>all</option><option>queues</option><option>exchanges</option></select></label>
      <label>Priority <input name="priority" type="number" value="0"></label>
      <label>Definition (JSON) <textarea name="definition">{"max-length": 1000}</textarea></label><button>Set policy</button></form>`;
    $("#add-policy").onsubmit = submit(async f => api("PUT", `/policies/${enc(f.vhost.value)}/${enc(f.name.value)}`,
      { pattern: f.pattern.value, "apply-to": f.applyto.value, priority: Number(f.priority.value), definition: JSON.parse(f.definition.value) }));
    for (const b of document.querySelectorAll("[data-del]")) {
      const [vhost, name] = b.dataset.del.split("|");
      b.onclick = async () => { await api("DELETE", `/policies/${enc(vhost)}/${enc(name)}`); route(); };
    }
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
    $("#view").innerHTML = `<h2>Queue ${esc(name)} <small>in ${esc(vhost)}</small></h2><div id="live"></div>
      <form class="card" id="get"><h3>Get messages</h3><label>Count <input name="count" type="number" value="1"></label>
        <label>Ack mode <select name="ackmode"><option value="ack_requeue_true">Nack, requeue</option><option value="ack_requeue_false">Ack, remove</option>
        <option value="reject_requeue_false">Reject, dead-letter</option></select></label><button>Get</button><div id="got"></div></form>
      <form class="card" id="publish"><h3>Publish a message</h3><label>Payload <textarea name="payload"></textarea></label><button>Publish</button></form>
      <div class="card"><button id="purge">Purge messages</button> <button id="delete">Delete queue</button> <span id="result"></span></div>`;
    const update = await live(() => api("GET", base), (box, q) => {
      box.innerHTML = totals([["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged], ["Total", q.messages], ["Consumers", q.consumers]])
        + `<div class="charts"></div><div class="card"><h3>Details</h3><pre>${esc(JSON.stringify({ durable: q.durable, auto_delete: q.auto_delete, exclusive: q.exclusive, type: q.type,
          arguments: q.arguments, policy: q.policy, effective_policy_definition: q.effective_policy_definition }, null, 2))}</pre>
          ${table(q.consumer_details, [{ key: "consumer_tag", title: "Consumer" }, { key: "prefetch_count", title: "Prefetch" }, { key: "ack_required", title: "Ack required" }])}</div>`;
      showCharts($(".charts", box), `queue ${vhost} ${name}`, q, [depthChart(q => q),
        rateChart([["publish", BLUE, "publish"], ["deliver/get", GREEN, "deliver_get"], ["ack", ORANGE, "ack"], ["redelivered", PURPLE, "redeliver"]])]);
    });
    $("#get").onsubmit = submit(async f => {
      const msgs = await api("POST", base + "/get", { count: Number(f.count.value), ackmode: f.ackmode.value, encoding: "auto" });
      $("#got").innerHTML = msgs.map(m => `<pre>${esc(m.routing_key)}: ${esc(m.payload)}</pre>`).join("") || "<p>Queue is empty</p>";
    }, false);
    $("#publish").onsubmit = submit(async f => api("POST", `/exchanges/${enc(vhost)}/amq.default/publish`,
      { routing_key: name, payload: f.payload.value, payload_encoding: "string", properties: {} }));
    $("#purge").onclick = async () => { await api("DELETE", base + "/contents"); route(); };
    $("#delete").onclick = async () => { await api("DELETE", base); location.hash = "#/queues"; };
    return update;
  },
  async exchange(vhost, name) {
    const base = `/exchanges/${enc(vhost)}/${enc(name)}`;
    const x = await api("GET", base);
    const bindings = name === "amq.default" ? [] : await api("GET", base + "/bindings/source");
    $("#view").innerHTML = `<h2>Exchange ${esc(x.name || "(AMQP default)")} <small>${esc(x.type)} in ${esc(x.vhost)}</small></h2><div id="live"></div>
      <div class="card"><h3>Bindings from here</h3>${table(bindings, [{ key: "destination", title: "To" }, { key: "destination_type", title: "Type" },
        { key: "routing_key", title: "Routing key" }, { key: "arguments", title: "Arguments", value: r => JSON.stringify(r.arguments) }])}</div>
      <form class="card" id="explain"><h3>Route explain</h3><p>Where a message would go, and why, without publishing it.</p>
        <label>Routing key <input name="key"></label><label>Headers (JSON, optional) <input name="headers" placeholder='{"CC": ["other.key"]}'></label>
        <button>Explain</button><div id="explained"></div></form>
      <form class="card" id="publish"><h3>Publish a message</h3><label>Routing key <input name="key"></label>
        <label>Payload <textarea name="payload"></textarea></label><button>Publish</button><span id="routed"></span></form>`;
    const update = await live(() => api("GET", base), (box, x) => {
      showCharts(box, `exchange ${vhost} ${name}`, x, [rateChart([["publish in", BLUE, "publish_in"], ["publish out", PINK, "publish_out"]])]);
    });
    $("#explain").onsubmit = submit(async f => {
      const body = { routing_key: f.key.value };
      if (f.headers.value) body.headers = JSON.parse(f.headers.value);
      const r = await api("POST", `/route/${enc(vhost)}/${enc(name)}`, body);
      $("#explained").innerHTML = `<p>Reaches <b>${r.queues.length}</b> queue(s): ${r.queues.map(esc).join(", ") || "(none)"}</p>`
        + table(r.bindings, [{ key: "source", title: "From" }, { key: "routing_key", title: "Binding key" }, { key: "destination", title: "To" }, { key: "destination_type", title: "Type" }])
        + r.notes.map(n => `<p>${esc(n)}</p>`).join("");
    }, false);
    $("#publish").onsubmit = submit(async f => {
      const r = await api("POST", base + "/publish", { routing_key: f.key.value, payload: f.payload.value, payload_encoding: "string", properties: {} });
      $("#routed").textContent = r.routed ? " Routed." : " Not routed.";
    }, false);
    return update;
  },
};

// What a user may do in a vhost, as the users page lists, sets and clears it: permissions (one
// per user and vhost) and topic permissions (one per user, vhost and topic exchange).
const GRANTS = [
  { path: "permissions", title: "Permissions", set: "Set permission", fields: [["configure", ".*"], ["write", ".*"], ["read", ".*"]] },
  { path: "topic-permissions", title: "Topic permissions", set: "Set topic permission", clearAll: "Clear all of this user in this vhost",
    fields: [["exchange", "amq.topic"], ["write", ".*"], ["read", ".*"]],
    about: `On a topic exchange, the routing keys a user may publish with (write) and bind with (read); {username} and
      {vhost} in them stand for the user's and the vhost's names. Without one on an exchange, a user may use any key there.` },
];
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
  for (const b of form.querySelectorAll("[data-clear]")) b.onclick = () => attempt(form, () => api("DELETE", b.dataset.clear));
  for (const b of form.querySelectorAll("[data-clear-all]")) b.onclick = () => attempt(form, f => api("DELETE", grantPath(grant, who(f))));
}

// A form's submit handler: attempt() its action.
function submit(action, redraw = true) {
  return ev => { ev.preventDefault(); return attempt(ev.target, action, redraw); };
}

// Run a form's action, then show its error in the form, or redraw the page.
async function attempt(form, action, redraw = true) {
  for (const old of form.querySelectorAll(".error")) old.remove();
  try { await action(form); if (redraw) route(); } catch (err) {
    if (err.message !== "unauthorised") form.insertAdjacentHTML("beforeend", `<p class="error">${esc(err.message)}</p>`);
  }
}

const totals = pairs => `<div class="totals">${pairs.map(([k, v]) => `<div class="total" data-total="${esc(k)}"><b>${esc(v)}</b>${esc(k)}</div>`).join("")}</div>`;

// A page's changing part, `#live`: drawn from what `load` fetches now, and again every 5 s while
// the page is shown (the page returns the update; route() keeps the timer).
async function live(load, draw) {
  const update = async () => {
    const box = $("#live"), data = await load();
    if (box.isConnected) draw(box, data);
  };
  await update();
  return update;
}

// One colour a meaning, on every page.
const BLUE = "#1565c0", GREEN = "#2e7d32", ORANGE = "#ef6c00", PURPLE = "#6a1b9a", PINK = "#ad1457", TEAL = "#00897b", BROWN = "#8d6e63", GREY = "#616161";
// The two kinds of chart: an object's message counts (`counts` picks where they are), and its
// message_stats rates ([label, colour, counter]); the overview, a queue and an exchange show them.
const depthChart = counts => ({ id: "messages", title: "Queued messages", unit: "", series: [["ready", TEAL, o => counts(o).messages_ready],
  ["unacked", BROWN, o => counts(o).messages_unacknowledged], ["total", GREY, o => counts(o).messages]] });
const rateChart = (series, note) => ({ id: "rates", title: "Message rates (per second, sampled every 5 s)", unit: "/s", note,
  series: series.map(([label, colour, counter]) => [label, colour, o => rate(o, counter)]) });
// The charts' memory: the API reports only the latest figures (rates over the last 5 s sample), so
// each refresh of a page adds a point per chart, kept for CHART_SPAN while the tab is open.
const CHART_SPAN = 5 * 60 * 1000;

// Cards in `into`, a line chart each of an object's figures over time. A spec is {id, title,
// unit, series: [[label, colour, figure of obj]], note}; `key` names the object in state.charts.
function showCharts(into, key, obj, specs) {
  const now = Date.now();
  const charts = specs.map(spec => {
    const values = spec.series.map(([, , figure]) => Number(figure(obj)) || 0);
    const points = (state.charts[`${key} ${spec.id}`] || []).filter(p => p.t > now - CHART_SPAN).concat([{ t: now, values }]);
    state.charts[`${key} ${spec.id}`] = points;
    return { spec, values, points };
  });
  const legend = ({ spec, values }) => spec.series.map(([label, colour], i) =>
    `<span data-series="${esc(label)}"><i class="swatch" style="background:${colour}"></i>${esc(label)} <b>${esc(values[i])}</b>${esc(spec.unit)}</span>`);
  into.innerHTML = charts.map(chart => `<div class="card chart" id="chart-${esc(chart.spec.id)}"><h3>${esc(chart.spec.title)}</h3>
    <canvas width="900" height="180"></canvas><div class="legend">${legend(chart).join("")}</div>
    ${chart.spec.note ? `<p>${esc(chart.spec.note)}</p>` : ""}</div>`).join("");
  charts.forEach(({ spec, points }, i) => drawChart(into.querySelectorAll("canvas")[i], points, spec));
}

// One line a series, from the oldest point kept (left) to now (right), with a dot at the latest.
function drawChart(canvas, points, spec) {
  canvas.width = canvas.clientWidth || canvas.width;  // as wide as it is shown: text not stretched
  const ctx = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 16;
  const now = points[points.length - 1].t, span = Math.max(now - points[0].t, 1);
  const top = Math.max(1, ...points.flatMap(p => p.values));
  const x = p => w - 4 - ((now - p.t) / span) * (w - 8), y = v => h - pad - (v / top) * (h - 2 * pad);
  ctx.fillStyle = "#666";
  ctx.textAlign = "left";
  ctx.fillText((Number.isInteger(top) ? top : top.toFixed(1)) + spec.unit, 4, 12);
  ctx.fillText(span < 1000 ? "" : span < 120000 ? `${Math.round(span / 1000)} s ago` : `${Math.round(span / 60000)} min ago`, 4, h - 4);
  ctx.textAlign = "right";
  ctx.fillText("now", w - 4, h - 4);
  spec.series.forEach(([, colour], i) => {
    ctx.strokeStyle = ctx.fillStyle = colour;
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((p, j) => (j ? ctx.lineTo(x(p), y(p.values[i])) : ctx.moveTo(x(p), y(p.values[i]))));
    ctx.stroke();
    ctx.beginPath();
    ctx.arc(x(points[points.length - 1]), y(points[points.length - 1].values[i]), 3, 0, 2 * Math.PI);
    ctx.fill();
  });
}

async function route() {
  clearInterval(state.timer);
  if (!state.auth) { logout(); return; }
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = pages[parts[0] || ""];
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.getAttribute("href") === "#/" + (parts[0] || ""));
  if (!page) { $("#view").innerHTML = "<p>Not found.</p>"; return; }
  const shown = ++state.shown;
  let update;
  try { update = await page(...parts.slice(1)); } catch (err) {
    if (err.message !== "unauthorised") $("#view").innerHTML = `<p class="error">${esc(err.message)}</p>`;
  }
  // A page with figures that change returns how to update them: every 5 s, as the broker samples.
  if (typeof update === "function" && shown === state.shown) state.timer = setInterval(() => update().catch(() => {}), 5000);
}

window.addEventListener("hashchange", route);
if (state.auth) api("GET", "/whoami").then(me => { showWho(me); route(); }).catch(() => {});
else logout();
