// The dashboard's charts (uPlot), op-graph DAG (dagre layout, drawn as SVG) and copy buttons.
// Data comes from <script type="application/json"> blocks the server renders; text goes into
// the DOM only through textContent, never innerHTML (op names and module text are user data).
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const GROUP_COLOURS = ["#cfe0ff", "#d4f2d9", "#ffe3c2", "#ead7ff", "#ffd6dc", "#d3f3f5", "#f4efc4", "#e2e6ec"];
  const GROUP_STROKES = ["#2457c5", "#1e7b3a", "#b35c00", "#6b3fb3", "#b4233c", "#137a82", "#807000", "#5d6677"];

  function readJson(id) {
    const el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  function svgEl(name, attrs, text) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = text;
    return el;
  }

  function shorten(text, max) {
    return text.length > max ? text.slice(0, max - 1) + "…" : text;
  }

  // ------------------------------------------------------------------ op graph

  function drawDag(container, data) {
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: "TB", nodesep: 30, ranksep: 55, edgesep: 15, marginx: 16, marginy: 16 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of data.nodes) {
      const title = `${n.uid}: ${n.label}`;
      const role = n.anchor ? "anchor of group " + n.group : n.fused ? "fused, group " + n.group : n.group === null ? "not tiled" : "group " + n.group;
      const sub = `${n.kind} · ${(n.loop_ranges || []).map((r) => (r === null ? "?" : r)).join("×")} · ${role}`;
      const width = Math.max(120, 7.4 * Math.max(title.length, sub.length * 0.9) + 24);
      g.setNode(String(n.uid), { width, height: 44, node: n, title, sub, role });
    }
    data.edges.forEach((e, i) => {
      const label = e.fused ? "" : shorten(e.reason || "not fused", 46);
      g.setEdge(String(e.producer), String(e.consumer),
        { edge: e, label, width: label ? 6.3 * label.length : 0, height: label ? 16 : 0, labelpos: "c" }, "e" + i);
    });
    dagre.layout(g);

    const graph = g.graph();
    const svg = svgEl("svg", { width: graph.width, height: graph.height, viewBox: `0 0 ${graph.width} ${graph.height}`,
      "data-nodes": data.nodes.length, "data-edges": data.edges.length });
    const defs = svgEl("defs");
    for (const [id, colour] of [["arrow", "#5d6677"], ["arrow-unfused", "#b42318"]]) {
      const marker = svgEl("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
      marker.appendChild(svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }));
      defs.appendChild(marker);
    }
    svg.appendChild(defs);

    for (const id of g.edges()) {
      const info = g.edge(id);
      const e = info.edge;
      const d = info.points.map((p, i) => `${i ? "L" : "M"}${p.x.toFixed(1)},${p.y.toFixed(1)}`).join(" ");
      const path = svgEl("path", { d, fill: "none", class: e.fused ? "edge fused" : "edge unfused",
        stroke: e.fused ? "#5d6677" : "#b42318", "stroke-width": e.fused ? 1.6 : 1.4,
        "stroke-dasharray": e.fused ? "" : "5 4", "marker-end": e.fused ? "url(#arrow)" : "url(#arrow-unfused)" });
      const tip = e.fused ? `${e.producer} → ${e.consumer}: fused` : `${e.producer} → ${e.consumer}: not fused: ${e.reason || ""}`;
      path.appendChild(svgEl("title", {}, tip + (e.via && e.via.length ? ` (via ${e.via.join(", ")})` : "")));
      svg.appendChild(path);
      if (info.label) {
        const label = svgEl("text", { x: info.x, y: info.y + 4, "text-anchor": "middle", "font-size": 11, fill: "#b42318", class: "edge-label" }, info.label);
        label.appendChild(svgEl("title", {}, tip));
        svg.appendChild(label);
      }
    }
    for (const id of g.nodes()) {
      const info = g.node(id);
      const n = info.node;
      const k = n.group === null ? GROUP_COLOURS.length - 1 : n.group % (GROUP_COLOURS.length - 1);
      const group = svgEl("g", { class: "node", transform: `translate(${info.x - info.width / 2},${info.y - info.height / 2})` });
      group.appendChild(svgEl("rect", { width: info.width, height: info.height, rx: 6,
        fill: n.group === null ? "#f2f4f7" : GROUP_COLOURS[k], stroke: n.group === null ? "#98a2b3" : GROUP_STROKES[k],
        "stroke-width": n.anchor ? 3 : 1.4, "stroke-dasharray": n.fused ? "4 3" : "" }));
      group.appendChild(svgEl("text", { x: 10, y: 18, "font-size": 12.5, "font-weight": 600, fill: "#1d2330" }, info.title));
      group.appendChild(svgEl("text", { x: 10, y: 35, "font-size": 11, fill: "#5d6677" }, info.sub));
      group.appendChild(svgEl("title", {}, `${info.title} (${info.role})`));
      svg.appendChild(group);
    }
    container.replaceChildren(svg);
  }

  // ------------------------------------------------------------------ charts

  function chartWidth(el) {
    return Math.max(320, Math.floor(el.getBoundingClientRect().width || el.parentElement.clientWidth || 600));
  }

  function allPositive(values) {
    return values.every((v) => v === null || v > 0);
  }

  function points(size, stroke, fill) {
    return { paths: () => null, points: { show: true, size, stroke, fill, width: 1 } };
  }

  function scatterChart(el, d) {
    const logX = allPositive(d.footprint_kib);
    return new uPlot({
      width: chartWidth(el), height: 320,
      scales: { x: { time: false, distr: logX ? 3 : 1 }, y: { distr: allPositive(d.latency_ms) ? 3 : 1 } },
      axes: [{ label: "peak on-chip footprint (KiB)" }, { label: "predicted latency (ms)", size: 70 }],
      series: [
        { label: "footprint (KiB)" },
        { label: "plan", ...points(5, "#2457c5", "rgba(36,87,197,0.25)") },
        { label: "Pareto front", stroke: "#1e7b3a", width: 1.5, spanGaps: true, points: { show: true, size: 7, stroke: "#1e7b3a", fill: "#d4f2d9" } },
        { label: "chosen", ...points(12, "#b42318", "#b42318") },
      ],
      legend: { live: true },
    }, [d.footprint_kib, d.latency_ms, d.pareto_ms, d.chosen_ms], el);
  }

  function progressChart(el, d) {
    return new uPlot({
      width: chartWidth(el), height: 320,
      scales: { x: { time: false }, y: { distr: allPositive(d.latency_ms) ? 3 : 1 } },
      axes: [{ label: "trial number" }, { label: "predicted latency (ms)", size: 70 }],
      series: [
        { label: "trial" },
        { label: "trial's plan", ...points(4, "#98a2b3", "rgba(152,162,179,0.4)") },
        { label: "best so far", stroke: "#2457c5", width: 2, paths: uPlot.paths.stepped({ align: 1 }) },
      ],
    }, [d.trial, d.latency_ms, d.best_ms], el);
  }

  function fidelityChart(el, d) {
    const log = allPositive(d.predicted_ms) && allPositive(d.measured_ms);
    return new uPlot({
      width: chartWidth(el), height: 300,
      scales: { x: { time: false, distr: log ? 3 : 1 }, y: { distr: log ? 3 : 1 } },
      axes: [{ label: "predicted latency (ms)" }, { label: "measured latency (ms)", size: 70 }],
      series: [
        { label: "predicted (ms)" },
        { label: "plan", ...points(7, "#b35c00", "rgba(179,92,0,0.35)") },
        { label: "measured = predicted", stroke: "#98a2b3", width: 1, dash: [4, 4] },
      ],
    }, [d.predicted_ms, d.measured_ms, d.predicted_ms], el);
  }

  // ------------------------------------------------------------------ copy buttons

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    // Plain-HTTP pages on another host have no Clipboard API: copy through a selection.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    if (!ok) throw new Error("copy refused");
  }

  function wireCopyButtons() {
    for (const button of document.querySelectorAll("button.copy")) {
      const target = document.getElementById(button.dataset.copyTarget);
      const status = button.parentElement.querySelector(".copy-status");
      if (!target || target.tagName !== "PRE") {
        button.disabled = true;
        continue;
      }
      button.addEventListener("click", async () => {
        try {
          await copyText(target.textContent);
          status.textContent = "Copied";
          button.dataset.copied = "true";
        } catch (err) {
          status.textContent = "Copy failed: select the text and copy it by hand";
        }
        setTimeout(() => { status.textContent = ""; }, 4000);
      });
    }
  }

  // ------------------------------------------------------------------ job progress (polled)

  function finishedChart(el, s) {
    return new uPlot({
      width: chartWidth(el), height: 240,
      scales: { x: { time: false } },
      axes: [{ label: "seconds since the job was created (s)" }, { label: "items finished", size: 60 }],
      series: [
        { label: "seconds" },
        { label: "items finished", stroke: "#2457c5", width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: true, size: 5 } },
      ],
    }, [s.t_s, s.finished], el);
  }

  function setText(selector, text, root) {
    for (const el of (root || document).querySelectorAll(selector)) el.textContent = text;
  }

  function setStatus(el, state) {
    el.textContent = state;
    el.className = "status status-" + state;
  }

  function applyItem(it) {
    const row = document.querySelector(`tr[data-item-id="${Number(it.id)}"]`);
    if (!row) return;
    for (const el of row.querySelectorAll('[data-item="state"]')) setStatus(el, it.state);
    setText('[data-item="trials"]', String(it.trials), row);
    setText('[data-item="predicted"]', it.predicted, row);
    setText('[data-item="weighted"]', it.weighted, row);
    for (const el of row.querySelectorAll('[data-item="why"]')) {
      el.textContent = it.why;
      el.className = it.state === "failed" ? "bad" : "";
    }
    for (const el of row.querySelectorAll('[data-item="decision"]')) {
      if (it.decision_id === null) { el.textContent = "—"; continue; }
      const a = document.createElement("a");
      a.href = "/decisions/" + Number(it.decision_id);
      a.textContent = "decision " + Number(it.decision_id);
      el.replaceChildren(a);
    }
  }

  function applyProgress(p, chart) {
    for (const el of document.querySelectorAll('[data-live="state"]')) setStatus(el, p.state);
    for (const el of document.querySelectorAll('[data-live="progress"]')) { el.max = p.total; el.value = p.finished; }
    setText('[data-live="finished"]', String(p.finished));
    setText('[data-live="trials"]', p.trials.toLocaleString("en-US"));
    setText('[data-live="eta"]', p.eta);
    for (const [state, n] of Object.entries(p.counts)) setText(`[data-count="${state}"]`, String(n));
    if (p.counts.done) setText('[data-live="spec-note"]', "");
    p.items.forEach(applyItem);
    if (p.series.t_s.length > 1) setText('[data-live="chart-note"]', "");
    if (chart) chart.setData([p.series.t_s, p.series.finished]);
    const seen = document.body.dataset.updates ? Number(document.body.dataset.updates) : 0;
    document.body.dataset.updates = String(seen + 1);
    setText('[data-live="note"]', p.active ? `Updated ${new Date().toLocaleTimeString()}; updates every second.`
                                           : "The job has finished; this page no longer updates.");
  }

  function pollJob(live, chart) {
    async function tick() {
      try {
        const r = await fetch(live.url, { headers: { Accept: "application/json" }, cache: "no-store", credentials: "same-origin" });
        if (r.ok) {
          const p = await r.json();
          applyProgress(p, chart);
          if (!p.active) return;
        } else if (r.status === 401 || r.status === 404) {
          setText('[data-live="note"]', r.status === 401 ? "Logged out: reload to log in again." : "This job no longer exists.");
          return;
        }
      } catch (e) {
        // a failed poll (server restarting): try again at the next tick
      }
      setTimeout(tick, live.interval_ms);
    }
    setTimeout(tick, live.interval_ms);
  }

  function initJob() {
    const live = readJson("job-live");
    const progress = readJson("job-progress-data");
    if (!live || !progress) return;
    const el = document.getElementById("job-chart");
    const chart = el && window.uPlot ? finishedChart(el, progress.series) : null;
    if (live.active) pollJob(live, chart);
  }

  function init() {
    wireCopyButtons();
    initJob();
    const dag = readJson("dag-data");
    const dagEl = document.getElementById("dag");
    if (dag && dagEl && window.dagre) drawDag(dagEl, dag);
    const charts = readJson("charts-data");
    if (charts && window.uPlot) {
      const s = document.getElementById("scatter");
      const p = document.getElementById("progress");
      if (s) scatterChart(s, charts.scatter);
      if (p) progressChart(p, charts.progress);
    }
    const fid = readJson("fidelity-data");
    const fidEl = document.getElementById("fidelity");
    if (fid && fidEl && window.uPlot) fidelityChart(fidEl, fid);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
