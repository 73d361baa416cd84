// The live fabric map (docs/operations.md, "The fabric map"). Reads the manager's read API only:
// GET /api/v1/inventory long-polled (?after=version) and GET /api/v1/operations every few seconds.
// No framework and no build step: the SVG is drawn from strings, which at 1,000 devices is a few
// milliseconds, so every inventory version simply redraws the whole map.
"use strict";

(() => {
  const TOKEN_KEY = "fabric-dra-token";
  const API = "/api/v1";
  const LONG_POLL_SECONDS = 25;
  const OPERATIONS_EVERY_MS = 2000;
  const CELL = 16, GAP = 3, LANE_LABEL = 190, NODE_COLUMN = 260, PAD = 12;
  const IN_FLIGHT = new Set(["pending", "running"]);

  const view = { inventory: null, operations: [], selected: null, hoverNode: null, filter: "" };
  const $ = (id) => document.getElementById(id);

  const esc = (value) =>
    String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  // -- the token: from the URL fragment (never sent to a server), else asked for; kept per tab --
  function takeTokenFromFragment() {
    const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (match) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const response = await fetch(API + path, { headers, cache: "no-store" });
    if (!response.ok) {
      let code = "HTTP" + response.status, message = response.statusText;
      try {
        const body = await response.json();
        code = body.code || code;
        message = body.message || message;
      } catch (_) { /* not an ErrorBody */ }
      throw new ApiError(response.status, code, message);
    }
    return response.json();
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function setLive(state, text) {
    const live = $("live");
    live.dataset.live = state;
    live.textContent = text;
  }

  function needLogin(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("main").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    setLive("offline", "not signed in");
  }

  // -- the two loops: inventory (long poll) and operations --
  let generation = 0; // a new login restarts the loops; the old ones see a stale generation and end

  async function inventoryLoop(mine) {
    let version = null;
    while (mine === generation) {
      try {
        const query = version === null ? "" : `?after=${version}&timeoutSeconds=${LONG_POLL_SECONDS}`;
        const inventory = await api("/inventory" + query);
        if (mine !== generation) return;
        $("login").hidden = true;
        $("main").hidden = false;
        $("error").hidden = true;
        setLive("live", "live");
        if (inventory.version !== version) {
          version = inventory.version;
          render(inventory);
        }
      } catch (err) {
        if (mine !== generation) return;
        if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
          needLogin(`${err.code}: ${err.message}`);
          return;
        }
        showError(err);
        await sleep(2000);
      }
    }
  }

  async function operationsLoop(mine) {
    while (mine === generation) {
      try {
        view.operations = await api("/operations");
        renderOperations();
      } catch (err) {
        if (err instanceof ApiError && (err.status === 401 || err.status === 403)) return;
      }
      await sleep(OPERATIONS_EVERY_MS);
    }
  }

  function showError(err) {
    const why = err instanceof ApiError ? `${err.code}: ${err.message}` : `the manager does not answer (${err.message})`;
    setLive("offline", "reconnecting…");
    const box = $("error");
    box.textContent = why;
    box.hidden = false;
  }

  function start() {
    generation += 1;
    inventoryLoop(generation);
    operationsLoop(generation);
  }

  // -- what a device looks like --
  function category(device) {
    if (device.state === "bound" && !device.managed) return "foreign";
    return device.state;
  }

  function describe(device) {
    const where = [device.switch && `switch ${device.switch}`, device.port && `port ${device.port}`].filter(Boolean).join(", ");
    const lines = [
      `${device.name} (${device.type}${device.model ? ", " + device.model : ""})`,
      `pool ${device.pool}${where ? ", " + where : ""}`,
      `state ${device.state}${device.managed ? "" : " (bound outside fabric-dra: never touched)"}`,
    ];
    if (device.node || device.host) lines.push(`bound to node ${device.node ?? "(none)"} / host ${device.host ?? "?"}`);
    if (device.claimUid) lines.push(`claim ${device.claimUid}`);
    if (device.health !== "OK") lines.push(`health ${device.health}`);
    if (device.drain) lines.push(`drained: ${drainText(device.drain)}`);
    if (device.memoryPool) {
      const pool = device.memoryPool;
      lines.push(`memory ${gib(pool.usedBytes)} used, ${gib(Math.max(0, pool.sizeBytes - pool.usedBytes))} free; ${pool.shares.length} share(s)`);
    }
    for (const holder of device.partitions ?? []) lines.push(`partition ${holder.partition} on ${holder.node}: claim ${holder.claimUid}`);
    return lines.join("\n");
  }

  // What an operator's drain (fabric-dra drain) makes of a device: the taint's effect and reason.
  function drainText(drain) {
    return `${drain.reason} (${drain.effect}) since ${new Date(drain.since).toLocaleString()}, by ${drain.drains.join(", ")}`;
  }

  function matches(device, filter) {
    if (!filter) return true;
    const hay = [device.name, device.node, device.host, device.claimUid, device.model, device.type, device.switch, device.port, device.state, device.pool, device.drain ? "drained " + device.drain.reason : ""]
      .filter(Boolean).join(" ").toLowerCase();
    return filter.split(/\s+/).every((word) => hay.includes(word));
  }

  // -- drawing --
  let positions = new Map(); // device name → centre {x, y}
  let nodeBoxes = new Map(); // node (or host:<id>) → {x, y, w, h}

  function holderKey(device) {
    if (device.node) return device.node;
    if (device.host && device.state !== "free") return "host:" + device.host;
    return null;
  }

  function render(inventory) {
    const started = performance.now();
    view.inventory = inventory;
    const svg = $("map");
    // clientWidth includes no border, but a scrollbar would: stay a few pixels inside it
    const width = Math.max(720, ($("map-wrap").clientWidth || 1000) - 4);
    const laneWidth = width - NODE_COLUMN - PAD * 3;
    const perRow = Math.max(4, Math.floor((laneWidth - LANE_LABEL) / (CELL + GAP)));
    positions = new Map();
    nodeBoxes = new Map();
    const parts = [];
    const counts = { free: 0, warm: 0, attaching: 0, bound: 0, detaching: 0, unavailable: 0, foreign: 0, unhealthy: 0, drained: 0 };

    // pools → switches → devices by port
    const pools = new Map();
    for (const device of inventory.devices) {
      const sw = device.switch || "(no switch)";
      if (!pools.has(device.pool)) pools.set(device.pool, new Map());
      const switches = pools.get(device.pool);
      if (!switches.has(sw)) switches.set(sw, []);
      switches.get(sw).push(device);
      counts[category(device)] += 1;
      if (device.health !== "OK") counts.unhealthy += 1;
      if (device.drain) counts.drained += 1;
    }
    const byPort = (a, b) => (a.port || "").localeCompare(b.port || "", undefined, { numeric: true }) || a.name.localeCompare(b.name, undefined, { numeric: true });

    const natural = ([a], [b]) => a.localeCompare(b, undefined, { numeric: true });
    let y = PAD;
    for (const [pool, switches] of [...pools.entries()].sort(natural)) {
      const fabric = inventory.pools.find((p) => p.pool === pool)?.fabric ?? "";
      parts.push(`<text class="pool" x="${PAD}" y="${y + 14}">pool ${esc(pool)}${fabric ? " · fabric " + esc(fabric) : ""}</text>`);
      y += 24;
      for (const [sw, devices] of [...switches.entries()].sort(natural)) {
        devices.sort(byPort);
        const rows = Math.ceil(devices.length / perRow);
        const laneHeight = rows * (CELL + GAP) + GAP + 4;
        const ports = new Set(devices.map((d) => d.port).filter(Boolean)).size;
        parts.push(`<g class="switch" data-switch="${esc(pool + "/" + sw)}">`);
        parts.push(`<rect class="lane" x="${PAD}" y="${y}" width="${laneWidth}" height="${laneHeight}" rx="4"/>`);
        parts.push(`<text class="switch-name" x="${PAD + 8}" y="${y + 15}">switch ${esc(sw)}</text>`);
        parts.push(`<text class="switch-info" x="${PAD + 8}" y="${y + 29}">${devices.length} devices · ${ports} ports</text>`);
        devices.forEach((device, i) => {
          const x = PAD + LANE_LABEL + (i % perRow) * (CELL + GAP);
          const cy = y + GAP + 2 + Math.floor(i / perRow) * (CELL + GAP);
          positions.set(device.name, { x: x + CELL / 2, y: cy + CELL / 2 });
          const classes = [
            "device", "state-" + category(device), "type-" + device.type,
            device.health !== "OK" ? "unhealthy" : "",
            device.drain ? "drained" : "",
            matches(device, view.filter) ? "" : "dim",
            view.selected === device.name ? "selected" : "",
          ].filter(Boolean).join(" ");
          const data =
            `data-device="${esc(device.name)}" data-state="${esc(device.state)}" data-node="${esc(device.node ?? "")}" ` +
            `data-claim="${esc(device.claimUid ?? "")}" data-health="${esc(device.health)}" data-managed="${device.managed}" ` +
            `data-drain="${esc(device.drain ? device.drain.effect + " " + device.drain.reason : "")}"`;
          const title = `<title>${esc(describe(device))}</title>`;
          if (device.type === "cxl-memory") {
            parts.push(`<circle class="${classes}" ${data} cx="${x + CELL / 2}" cy="${cy + CELL / 2}" r="${CELL / 2 - 1}">${title}</circle>`);
          } else {
            parts.push(`<rect class="${classes}" ${data} x="${x}" y="${cy}" width="${CELL}" height="${CELL}" rx="3">${title}</rect>`);
          }
        });
        parts.push("</g>");
        y += laneHeight + GAP * 2;
      }
      y += 8;
    }
    const mapHeight = y;

    // nodes (and hosts that hold devices without being nodes) in the right column
    const holders = new Map();
    for (const node of inventory.nodes) holders.set(node.name, { label: node.name, sub: `host ${node.host}`, devices: [] });
    for (const device of inventory.devices) {
      const key = holderKey(device);
      if (key === null) continue;
      if (!holders.has(key)) holders.set(key, { label: key.startsWith("host:") ? `host ${key.slice(5)}` : key, sub: "not a node", devices: [] });
      holders.get(key).devices.push(device);
    }
    const nx = width - NODE_COLUMN - PAD;
    let ny = PAD;
    const chipsPerRow = Math.floor((NODE_COLUMN - 16) / 11);
    parts.push(`<text class="pool" x="${nx}" y="${ny + 14}">nodes</text>`);
    ny += 24;
    for (const [key, holder] of [...holders.entries()].sort(natural)) {
      const rows = Math.ceil(holder.devices.length / chipsPerRow);
      const h = 40 + rows * 11;
      nodeBoxes.set(key, { x: nx, y: ny, w: NODE_COLUMN, h });
      const hover = view.hoverNode === key ? " hover" : "";
      parts.push(`<g class="node${hover}" data-node-box="${esc(key)}">`);
      parts.push(`<rect class="node-box" x="${nx}" y="${ny}" width="${NODE_COLUMN}" height="${h}" rx="5"/>`);
      parts.push(`<text class="node-name" x="${nx + 8}" y="${ny + 15}">${esc(holder.label)}</text>`);
      const warm = holder.devices.filter((d) => d.state === "warm").length;
      const held = `${holder.devices.length - warm} bound${warm ? ` · ${warm} warm` : ""}`;
      parts.push(`<text class="node-info" x="${nx + 8}" y="${ny + 30}">${esc(holder.sub)} · ${held}</text>`);
      holder.devices.sort(byPort).forEach((device, i) => {
        const cx = nx + 8 + (i % chipsPerRow) * 11;
        const cy = ny + 36 + Math.floor(i / chipsPerRow) * 11;
        parts.push(`<rect class="chip state-${category(device)}" data-node-device="${esc(device.name)}" x="${cx}" y="${cy}" width="9" height="9" rx="2"><title>${esc(describe(device))}</title></rect>`);
      });
      parts.push("</g>");
      ny += h + 6;
    }
    parts.push('<g id="links"></g>');

    svg.setAttribute("width", String(width));
    svg.setAttribute("height", String(Math.max(mapHeight, ny) + PAD));
    svg.innerHTML = parts.join("");
    drawLinks();
    renderSummary(inventory, counts);
    renderSharing(inventory);
    renderDetail();
    renderOperations();
    document.body.dataset.version = String(inventory.version);
    document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  }

  function drawLinks() {
    const links = $("links");
    if (!links || !view.inventory) return;
    const wanted = view.inventory.devices.filter(
      (d) => (view.selected === d.name || (view.hoverNode !== null && holderKey(d) === view.hoverNode)) && holderKey(d) !== null,
    );
    links.innerHTML = wanted.map((device) => {
      const from = positions.get(device.name);
      const box = nodeBoxes.get(holderKey(device));
      if (!from || !box) return "";
      const toY = box.y + 20;
      const midX = (from.x + box.x) / 2;
      return `<path class="link state-${category(device)}" d="M${from.x},${from.y} C${midX},${from.y} ${midX},${toY} ${box.x},${toY}"/>`;
    }).join("");
  }

  function renderSummary(inventory, counts) {
    const parts = [`${inventory.devices.length} devices`];
    for (const [name, n] of Object.entries(counts)) if (n) parts.push(`<span class="count state-${name}">${esc(name)} ${n}</span>`);
    parts.push(`${inventory.nodes.length} nodes`, `version ${inventory.version}`, `updated ${new Date().toLocaleTimeString()}`);
    $("summary").innerHTML = parts.join(" · ");
  }

  function renderDetail() {
    const aside = $("detail");
    const device = view.inventory?.devices.find((d) => d.name === view.selected);
    if (!device) {
      aside.hidden = true;
      return;
    }
    const rows = Object.entries(device).filter(([, v]) => v !== null && v !== "");
    const ops = view.operations.filter((op) => op.device === device.name && IN_FLIGHT.has(op.state));
    aside.innerHTML =
      `<h2>${esc(device.name)}</h2><dl>${rows.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(k === "drain" ? drainText(v) : typeof v === "object" ? JSON.stringify(v) : v)}</dd>`).join("")}</dl>` +
      (ops.length ? `<p>in flight: ${ops.map((op) => `${esc(op.kind)} for ${esc(op.node)} (${age(op)})`).join(", ")}</p>` : "");
    aside.hidden = false;
  }

  function age(op) {
    const seconds = Math.max(0, (Date.now() - Date.parse(op.startedAt)) / 1000);
    return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.floor(seconds % 60)} s`;
  }

  const gib = (bytes) => `${(bytes / 2 ** 30).toFixed(2).replace(/\.?0+$/, "")} GiB`;

  // Each memory pool's used and free memory with its shares, and each GPU serving partitions with
  // its holders (docs/operations.md, "The fabric map").
  function renderSharing(inventory) {
    const rows = [];
    for (const device of inventory.devices) {
      const pool = device.memoryPool;
      if (!pool) continue;
      const free = Math.max(0, pool.sizeBytes - pool.usedBytes);
      rows.push(
        `<tr class="sharing-head" data-pool="${esc(device.name)}" data-used-bytes="${pool.usedBytes}" data-free-bytes="${free}">` +
        `<td>memory pool</td><td>${esc(device.name)}</td><td>${gib(pool.usedBytes)} used</td><td>${gib(free)} free</td>` +
        `<td>${pool.shares.length} share(s) of ${gib(pool.sizeBytes)}</td></tr>`);
      for (const share of pool.shares) {
        rows.push(
          `<tr data-share="${esc(share.shareId)}" data-node="${esc(share.node)}" data-claim="${esc(share.claimUid)}">` +
          `<td></td><td>share ${esc(share.shareId)}</td><td>${esc(share.node)}</td><td>${gib(share.memoryBytes)}</td>` +
          `<td>${esc(share.state)} · claim ${esc(share.claimUid)}</td></tr>`);
      }
    }
    for (const device of inventory.devices) {
      if (!device.partitions || !device.partitions.length) continue;
      const node = device.partitions[0].node;
      rows.push(
        `<tr class="sharing-head" data-gpu="${esc(device.name)}" data-node="${esc(node)}" data-holders="${device.partitions.length}">` +
        `<td>GPU</td><td>${esc(device.name)}</td><td>${esc(node)}</td><td>${device.partitions.length} partition(s)</td>` +
        `<td>${esc(device.model ?? "")}</td></tr>`);
      for (const holder of device.partitions) {
        rows.push(
          `<tr data-partition="${esc(holder.partition)}" data-node="${esc(holder.node)}" data-claim="${esc(holder.claimUid)}">` +
          `<td></td><td>${esc(holder.partition)}</td><td>${esc(holder.node)}</td><td></td><td>claim ${esc(holder.claimUid)}</td></tr>`);
      }
    }
    $("sharing-section").hidden = rows.length === 0;
    $("sharing").tBodies[0].innerHTML = rows.join("");
  }

  function renderOperations() {
    const inFlight = view.operations.filter((op) => IN_FLIGHT.has(op.state));
    $("ops-count").textContent = `(${inFlight.length})`;
    $("operations").tBodies[0].innerHTML = inFlight.length
      ? inFlight.map((op) =>
          `<tr data-operation="${esc(op.id)}"><td>${esc(op.kind)}</td><td>${esc(op.device)}</td><td>${esc(op.node)}</td>` +
          `<td>${esc(op.claimUid)}</td><td>${esc(op.state)}</td><td class="age">${age(op)}</td><td>${esc(op.redfishTask ?? "")}</td></tr>`).join("")
      : '<tr><td colspan="7" class="none">none</td></tr>';
  }

  function legend() {
    const states = [["free", "free"], ["warm", "warm (bound to a node, no claim yet)"], ["attaching", "attaching / detaching"], ["bound", "bound by fabric-dra"],
      ["foreign", "bound outside fabric-dra"], ["unavailable", "unavailable"]];
    $("legend").innerHTML =
      states.map(([cls, label]) => `<span class="key"><i class="swatch state-${cls}"></i>${label}</span>`).join("") +
      '<span class="key"><i class="swatch unhealthy"></i>unhealthy</span><span class="key"><i class="swatch drained"></i>drained</span><span class="key"><i class="swatch round"></i>CXL memory chunk</span>';
  }

  function wire() {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      start();
    });
    $("filter").addEventListener("input", () => {
      view.filter = $("filter").value.trim().toLowerCase();
      if (view.inventory) render(view.inventory);
    });
    const svg = $("map");
    svg.addEventListener("click", (event) => {
      const name = event.target.closest("[data-device], [data-node-device]")?.dataset;
      view.selected = name ? name.device ?? name.nodeDevice : null;
      if (view.inventory) render(view.inventory);
    });
    svg.addEventListener("mouseover", (event) => {
      const box = event.target.closest("[data-node-box]");
      const key = box ? box.dataset.nodeBox : null;
      if (key !== view.hoverNode) {
        view.hoverNode = key;
        drawLinks();
      }
    });
    window.addEventListener("resize", () => view.inventory && render(view.inventory));
    // Ages of operations in flight tick without waiting for the next poll.
    setInterval(() => {
      for (const row of $("operations").tBodies[0].rows) {
        const op = view.operations.find((o) => o.id === row.dataset.operation);
        if (op) row.querySelector(".age").textContent = age(op);
      }
    }, 1000);
  }

  // For the browser test and for poking at the map from the console.
  window.fabricMap = { render, view };

  document.addEventListener("DOMContentLoaded", () => {
    takeTokenFromFragment();
    legend();
    wire();
    start();
  });
})();
