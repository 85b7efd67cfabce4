// workbench.explore: the view of the explorer widget (anywidget ESM; shipped in the Python package, no CDN).
// Python owns all logic (workbench/explore/state.py); this file draws the payload it sends and reports clicks.
// Buffers: `panels` float16 maps (per panel, row-major on its grid), `outlines` uint8 0/1, `strip` uint8 thumbnails
// (255 = no value), `strip_max` float16 per-thumbnail maxima, `image` uint8 (H, W[, 3]).

const PANEL = 224; // panel size in CSS pixels
const THUMB = 44;

// viridis, 9 stops, linearly interpolated
const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
  [92, 200, 99], [170, 220, 50], [253, 231, 37]];

// the image's own panel: its label, the image id and a canvas tagged with that id (the caller draws into it)
function imageBox(pixelsOf) {
  const ibox = el("div", "wbx-panel");
  ibox.appendChild(el("div", "wbx-label", "image"));
  ibox.appendChild(el("div", "wbx-sub wbx-note", pixelsOf));
  const ic = canvasOf(PANEL, PANEL, "wbx-canvas wbx-image");
  ic.dataset.imageId = pixelsOf;
  ic.dataset.mapImageId = pixelsOf;
  return [ibox, ic];
}

function colour(t) {
  if (!(t >= 0)) t = 0;
  if (t > 1) t = 1;
  const x = t * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

function halfToFloat(h) {
  const s = (h & 0x8000) ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * Math.pow(2, -14) * (m / 1024);
  if (e === 31) return m ? NaN : s * Infinity;
  return s * Math.pow(2, e - 15) * (1 + m / 1024);
}

function bytesOf(value) {
  if (!value) return new Uint8Array(0);
  if (value instanceof DataView) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (value.buffer) return new Uint8Array(value.buffer, value.byteOffset || 0, value.byteLength);
  return new Uint8Array(0);
}

function halves(value) {
  const b = bytesOf(value);
  const out = new Float32Array(b.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = halfToFloat(b[2 * i] | (b[2 * i + 1] << 8));
  return out;
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "n/a";
  return Math.abs(v) >= 100 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : v.toPrecision(3);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// a w x h canvas of class cls (none when omitted)
function canvasOf(w, h, cls) {
  const c = el("canvas", cls);
  c.width = w;
  c.height = h;
  return c;
}

// the image as an offscreen canvas (grey or RGB)
function imageCanvas(model) {
  const shape = model.get("image_shape") || [];
  const data = bytesOf(model.get("image"));
  if (shape.length < 2 || !data.length) return null;
  const [h, w] = shape;
  const rgb = shape.length === 3;
  const c = canvasOf(w, h);
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(w, h);
  for (let i = 0; i < h * w; i++) {
    const r = rgb ? data[3 * i] : data[i];
    const g = rgb ? data[3 * i + 1] : data[i];
    const b = rgb ? data[3 * i + 2] : data[i];
    img.data.set([r, g, b, 255], 4 * i);
  }
  ctx.putImageData(img, 0, 0);
  return c;
}

// blue - white - red for signed maps (differences), 0 = white
function diverging(t) {
  if (!(t >= 0)) t = 0;
  if (t > 1) t = 1;
  const lo = [33, 102, 172], mid = [247, 247, 247], hi = [178, 24, 43];
  const [a, b, f] = t < 0.5 ? [lo, mid, t / 0.5] : [mid, hi, (t - 0.5) / 0.5];
  return a.map((c, k) => Math.round(c + f * (b[k] - c)));
}

function drawPanel(canvas, base, map, grid, vmin, vmax, outline, cell, pruned, opts = {}) {
  const ctx = canvas.getContext("2d");
  const size = canvas.width;
  const cmap = opts.diverging ? diverging : colour;
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, size, size);
  if (base) ctx.drawImage(base, 0, 0, size, size);
  const [gh, gw] = grid;
  const ch = size / gh, cw = size / gw;
  if (map) {
    ctx.globalAlpha = opts.alpha ?? 0.75;
    for (let y = 0; y < gh; y++) {
      for (let x = 0; x < gw; x++) {
        const v = map[y * gw + x];
        if (Number.isNaN(v)) continue;
        const [r, g, b] = cmap((v - vmin) / ((vmax - vmin) || 1));
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(x * cw, y * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    ctx.globalAlpha = 1;
  }
  if (opts.gridLines !== false) {
    ctx.strokeStyle = "rgba(255,255,255,0.18)";
    ctx.lineWidth = 1;
    for (let y = 1; y < gh; y++) { ctx.beginPath(); ctx.moveTo(0, y * ch); ctx.lineTo(size, y * ch); ctx.stroke(); }
    for (let x = 1; x < gw; x++) { ctx.beginPath(); ctx.moveTo(x * cw, 0); ctx.lineTo(x * cw, size); ctx.stroke(); }
  }
  if (outline) {
    ctx.strokeStyle = "white";
    ctx.lineWidth = 1.5;
    for (let y = 0; y < gh; y++) for (let x = 0; x < gw; x++) {
      if (!outline[y * gw + x]) continue;
      // draw only the borders between inside and outside cells: outlines the kept keys / the window
      const inside = (yy, xx) => yy >= 0 && yy < gh && xx >= 0 && xx < gw && outline[yy * gw + xx];
      ctx.beginPath();
      if (!inside(y - 1, x)) { ctx.moveTo(x * cw, y * ch); ctx.lineTo((x + 1) * cw, y * ch); }
      if (!inside(y + 1, x)) { ctx.moveTo(x * cw, (y + 1) * ch); ctx.lineTo((x + 1) * cw, (y + 1) * ch); }
      if (!inside(y, x - 1)) { ctx.moveTo(x * cw, y * ch); ctx.lineTo(x * cw, (y + 1) * ch); }
      if (!inside(y, x + 1)) { ctx.moveTo((x + 1) * cw, y * ch); ctx.lineTo((x + 1) * cw, (y + 1) * ch); }
      ctx.stroke();
    }
  }
  if (cell && cell[0] >= 0) {
    const [sy, sx] = opts.cellSize || [1, 1];
    ctx.strokeStyle = "red";
    ctx.lineWidth = 2.5;
    ctx.strokeRect(cell[1] * cw + 1, cell[0] * ch + 1, sx * cw - 2, sy * ch - 2);
  }
  if (pruned) {
    ctx.fillStyle = "rgba(128,128,128,0.75)";
    ctx.fillRect(0, 0, size, size);
    if (size >= 100) {
      ctx.fillStyle = "white";
      ctx.font = "bold 14px sans-serif";
      const text = opts.greyText ?? "pruned";
      ctx.fillText(text, size / 2 - ctx.measureText(text).width / 2, size / 2);
    }
  }
}

function colourBar(vmin, vmax, units, diverging_) {
  const box = el("div", "wbx-cbar");
  const c = canvasOf(PANEL, 10);
  const ctx = c.getContext("2d");
  for (let x = 0; x < PANEL; x++) {
    const [r, g, b] = (diverging_ ? diverging : colour)(x / (PANEL - 1));
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, 0, 1, 10);
  }
  box.appendChild(c);
  const ticks = el("div", "wbx-ticks");
  ticks.appendChild(el("span", "", fmt(vmin)));
  ticks.appendChild(el("span", "wbx-units", units || ""));
  ticks.appendChild(el("span", "", fmt(vmax)));
  box.appendChild(ticks);
  return box;
}

const COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

// the agreement strip: per student, JS and top-10% overlap per reference layer, for the selected head (or the mean)
function agreementChart(state) {
  const box = el("div", "wbx-agree");
  const names = Object.keys(state.agreement || {});
  if (!names.length) return box;
  const labels = state.ref_layers;
  const layers = labels.length;
  const perHead = state.head !== null && state.head !== undefined;
  const W = 400, H = 124, L = 34, B = 34, PW = W - L - 110; // plot width; the legend at its right
  for (const metric of ["js", "topk"]) {
    const key = perHead ? `${metric}_head` : metric;
    const c = canvasOf(W, H, "wbx-chart");
    c.dataset.metric = metric;
    c.dataset.series = key;
    const ctx = c.getContext("2d");
    ctx.fillStyle = "white";
    ctx.fillRect(0, 0, W, H);
    ctx.strokeStyle = "#888";
    ctx.strokeRect(L, 4, PW, H - B - 4);
    ctx.fillStyle = "#333";
    ctx.font = "10px sans-serif";
    const what = metric === "js" ? "JS (bits)" : "top-10% overlap";
    ctx.fillText(`${what}, ${perHead ? "head " + state.head : "mean over heads"}`, L + 4, 14);
    ctx.fillText("1", L - 10, 10);
    ctx.fillText("0", L - 10, H - B);
    const px = (i) => L + (layers > 1 ? i / (layers - 1) : 0.5) * (PW - 6) + 3;
    const py = (v) => 4 + (1 - v) * (H - B - 8);
    const every = Math.max(1, Math.ceil(layers / 12));
    ctx.textAlign = "center";
    labels.forEach((lab, i) => { if (i % every === 0 || i === state.layer) ctx.fillText(String(lab), px(i), H - B + 12); });
    ctx.fillText("reference layer", L + PW / 2, H - 6);
    ctx.textAlign = "start";
    let any = false;
    names.forEach((name, n) => {
      const vals = state.agreement[name][key] || [];
      ctx.strokeStyle = COLOURS[n % COLOURS.length];
      ctx.fillStyle = COLOURS[n % COLOURS.length];
      ctx.beginPath();
      let started = false;
      vals.forEach((v, i) => {
        if (v === null) { started = false; return; }
        any = true;
        if (!started) ctx.moveTo(px(i), py(v)); else ctx.lineTo(px(i), py(v));
        started = true;
      });
      ctx.stroke();
      vals.forEach((v, i) => { if (v !== null) ctx.fillRect(px(i) - 2, py(v) - 2, 4, 4); });
      ctx.fillText(name, L + PW + 8, 14 + 12 * n);
    });
    if (!any) {
      ctx.fillStyle = "#777";
      ctx.fillText(perHead ? `no head ${state.head} to compare here` : "not comparable (other keys)", L + 20, H / 2 - 8);
    }
    ctx.strokeStyle = "#000";
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(px(state.layer), 4);
    ctx.lineTo(px(state.layer), H - B);
    ctx.stroke();
    box.appendChild(c);
  }
  return box;
}

function floats(value) {
  const b = bytesOf(value);
  const out = new Float32Array(b.length >> 2);
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

// the explanation view (state.mode === "explain"): one explainer's map per model over the shown image, one colour
// scale per explainer (Python's ExplanationState); a model the explainer does not apply to shows the reason
function explanationView(root, state, base, buffer, pixelsOf) {
  const title = el("div", "wbx-title");
  title.appendChild(el("span", "wbx-query", `explainer: ${state.method}`));
  title.appendChild(el("span", "", " · "));
  title.appendChild(el("span", "wbx-image-id", state.image_id));
  title.appendChild(el("span", "", ` · ${state.scale === "shared" ? "one colour scale for every model" : "a colour scale per panel"}`));
  root.appendChild(title);
  const readout = el("div", "wbx-readout", "hover a panel for its value");
  const row = el("div", "wbx-row");
  row.style.gridTemplateColumns = `repeat(${state.panels.length + 1}, minmax(110px, ${PANEL}px))`;
  const [ibox, ic] = imageBox(pixelsOf);
  drawPanel(ic, base, null, [1, 1], 0, 1, null, null, false, { gridLines: false });
  ibox.appendChild(ic);
  row.appendChild(ibox);
  const maps = floats(buffer);
  let off = 0;
  state.panels.forEach((p) => {
    const n = p.grid[0] * p.grid[1];
    let map = n ? maps.subarray(off, off + n) : null;
    off += n;
    const box = el("div", "wbx-panel");
    box.appendChild(el("div", "wbx-label", p.label));
    const wrong = p.image_id !== pixelsOf;
    let sub = map ? state.method : `${state.method} does not apply (why: below)`;
    if (wrong) {
      sub = `maps of ${p.image_id} are not drawn over ${pixelsOf}`;
      map = null;
    }
    box.appendChild(el("div", wrong || !map ? "wbx-sub wbx-note wbx-bad" : "wbx-sub wbx-note", sub));
    const c = canvasOf(PANEL, PANEL, "wbx-canvas wbx-explain");
    c.dataset.model = p.label;
    c.dataset.method = state.method;
    c.dataset.imageId = pixelsOf;
    c.dataset.mapImageId = p.image_id;
    c.dataset.applies = map ? "1" : "0";
    c.title = map ? `${p.label}: ${state.method}` : `${p.label}: ${p.note}`;
    if (map) {
      drawPanel(c, base, map, p.grid, p.vmin, p.vmax, null, null, false, { diverging: state.signed, gridLines: false, alpha: 0.8 });
      hoverReadout(c, readout, p, map, { query_label: "" }, `cell of its ${p.grid[0]}×${p.grid[1]} map`);
    } else {  // greyed, with the reason beside it: never a blank panel
      drawPanel(c, base, null, [1, 1], 0, 1, null, null, true, { gridLines: false, greyText: "does not apply" });
    }
    box.appendChild(c);
    if (map) box.appendChild(colourBar(p.vmin, p.vmax, p.units, state.signed));
    else box.appendChild(el("div", "wbx-sub wbx-reason", p.note));
    row.appendChild(box);
  });
  root.appendChild(row);
  root.appendChild(readout);
}

// the value under the pointer of a panel canvas
function hoverReadout(canvas, readout, p, map, state, what_ = null) {
  canvas.addEventListener("mousemove", (ev) => {
    const r = canvas.getBoundingClientRect();
    const [gh, gw] = p.grid;
    const y = Math.min(gh - 1, Math.floor(((ev.clientY - r.top) / r.height) * gh));
    const x = Math.min(gw - 1, Math.floor(((ev.clientX - r.left) / r.width) * gw));
    const v = map ? map[y * gw + x] : NaN;
    const what = what_ || (state.query_label.startsWith("key ") ? "query" : "key");
    readout.textContent = `${p.label} · ${what} (${y}, ${x}): ${fmt(v)} ${p.units || ""}`;
    readout.dataset.model = p.label;
    readout.dataset.value = Number.isNaN(v) ? "" : String(v);
  });
  canvas.addEventListener("mouseleave", () => { readout.textContent = "hover a panel for its value"; });
}

// the latent view (workbench/explore/latents.py): the clicked token's active crosscoder latents (a row click picks
// one) and the picked latent's maps (its code; its encoding from the teacher's and the student's activation alone)
const LATENT_CLASS = { shared: "shared", teacher_only: "teacher-only", student_only: "student-only", partial: "partial" };

function latentView(model, base, pixelsOf, onPick) {
  const lat = model.get("latents") || {};
  const box = el("div", "wbx-latents");
  if (!lat.models) return box;
  box.appendChild(el("div", "wbx-label", `crosscoder latents · ${lat.models.join(" + ")} at ${lat.hooks.join(" / ")}`));
  const where = lat.cell[0] >= 0 ? `token (${lat.cell[0]}, ${lat.cell[1]})` : "this token";
  box.appendChild(el("div", "wbx-sub", `${lat.active.length} latents active on ${where} (largest code first; click one to show it over the image)`));
  const table = el("table", "wbx-latent-table");
  const head = el("tr");
  ["latent", "class", "activation", "rel. decoder norm"].forEach((h) => head.appendChild(el("th", "", h)));
  table.appendChild(head);
  lat.active.forEach((a) => {
    const tr = el("tr", "wbx-latent-row" + (a.id === lat.picked ? " wbx-picked" : ""));
    tr.dataset.latent = String(a.id);
    [String(a.id), LATENT_CLASS[a.cls] || a.cls, fmt(a.activation), fmt(a.relative)].forEach((v) => tr.appendChild(el("td", "", v)));
    tr.addEventListener("click", () => onPick(a.id));
    table.appendChild(tr);
  });
  const list = el("div", "wbx-latent-list");  // scrolls: a token may have dozens of active latents
  list.appendChild(table);
  box.appendChild(list);
  const current = table.querySelector("tr.wbx-picked");  // keep the picked row in the list's view
  if (current) requestAnimationFrame(() => { list.scrollTop = Math.max(0, current.offsetTop - list.clientHeight / 2); });
  if (lat.picked === null || lat.picked === undefined || !lat.panels) return box;
  box.appendChild(el("div", "wbx-label", `latent ${lat.picked} (${LATENT_CLASS[lat.picked_cls] || lat.picked_cls}, relative decoder norm ${fmt(lat.picked_relative)}) over the image`));
  const row = el("div", "wbx-row");
  row.style.gridTemplateColumns = `repeat(${lat.panels.length}, minmax(110px, ${PANEL}px))`;
  const maps = halves(model.get("latent_maps"));
  const n = lat.grid[0] * lat.grid[1];
  const wrong = lat.image_id !== pixelsOf;
  const titles = { code: "crosscoder code (both models)" };
  lat.panels.forEach((name, i) => {
    const p = el("div", "wbx-panel");
    p.appendChild(el("div", "wbx-label", titles[name] || `${name}'s encoding alone`));
    p.appendChild(el("div", wrong ? "wbx-sub wbx-bad" : "wbx-sub", wrong ? `maps of ${lat.image_id} are not drawn over ${pixelsOf}` : lat.image_id));
    const c = canvasOf(PANEL, PANEL, "wbx-canvas wbx-latent-map");
    c.dataset.panel = name;
    c.dataset.latent = String(lat.picked);
    c.dataset.mapImageId = lat.image_id;
    drawPanel(c, base, wrong ? null : maps.subarray(i * n, (i + 1) * n), lat.grid, lat.vmin, lat.vmax, null, lat.cell, false);
    p.appendChild(c);
    const pre = Object.entries(lat.prefix || {}).map(([k, v]) => `${k}: ${fmt(v[i])}`).join(" · ");
    if (pre) p.appendChild(el("div", "wbx-sub", pre));
    p.appendChild(colourBar(lat.vmin, lat.vmax, lat.units, false));
    row.appendChild(p);
  });
  box.appendChild(row);
  return box;
}

function render({ model, el: root }) {
  root.classList.add("wbx");
  let base = null;
  let clicks = 0;
  let picks = 0;
  let latentPicks = 0;
  let pending = false;

  function sendClick(c, ev) {
    const r = c.getBoundingClientRect();
    const fy = (ev.clientY - r.top) / r.height, fx = (ev.clientX - r.left) / r.width;
    clicks += 1;
    model.set("click", [fy, fx, clicks]);
    model.save_changes();
  }

  function redraw() {
    pending = false;
    const state = model.get("state") || {};
    const pixelsOf = model.get("image_id") || "";
    root.innerHTML = "";
    const err = model.get("error");
    if (err) root.appendChild(el("div", "wbx-error", err));
    if (!state.panels) return;
    if (state.mode === "explain") return explanationView(root, state, base, model.get("panels"), pixelsOf);
    const head = state.head === null ? "mean over heads" : `head ${state.head}`;
    const title = el("div", "wbx-title");
    title.appendChild(el("span", "wbx-query", state.query_label.startsWith("key ") ? state.query_label : `query: ${state.query_label}`));
    const idSpan = el("span", "wbx-image-id", state.image_id);
    title.appendChild(el("span", "", " · "));
    title.appendChild(idSpan);
    title.appendChild(el("span", "", ` · ${head} · click a patch on any panel`));
    root.appendChild(title);
    const readout = el("div", "wbx-readout", "hover a panel for its value");
    const row = el("div", "wbx-row");
    row.style.gridTemplateColumns = `repeat(${state.panels.length + 1}, minmax(110px, ${PANEL}px))`;
    // the image alone, with the query marked
    const ref = state.panels[0];
    const [ibox, ic] = imageBox(pixelsOf);
    drawPanel(ic, base, null, ref.grid, 0, 1, null, ref.cell, false, { gridLines: false, cellSize: ref.cell_size });
    ic.addEventListener("click", (ev) => sendClick(ic, ev));
    ibox.appendChild(ic);
    row.appendChild(ibox);
    const maps = halves(model.get("panels"));
    const outlines = bytesOf(model.get("outlines"));
    let off = 0, ooff = 0;
    state.panels.forEach((p) => {
      const n = p.grid[0] * p.grid[1];
      let map = maps.subarray(off, off + n);
      off += n;
      let outline = null;
      if (p.outline) { outline = outlines.subarray(ooff, ooff + n); ooff += n; }
      const box = el("div", "wbx-panel");
      box.appendChild(el("div", "wbx-label", `${p.label} · ${p.measure}`));
      const wrong = p.image_id !== pixelsOf;
      let sub = `layer ${p.layer}${p.note ? " · " + p.note : ""}`;
      if (wrong) {
        sub = `maps of ${p.image_id} are not drawn over ${pixelsOf}`;
        map = null;
      }
      box.appendChild(el("div", wrong ? "wbx-sub wbx-note wbx-bad" : "wbx-sub wbx-note", sub));
      const c = canvasOf(PANEL, PANEL, "wbx-canvas wbx-map");
      c.dataset.model = p.label;
      c.dataset.imageId = pixelsOf;
      c.dataset.mapImageId = p.image_id;
      c.dataset.pruned = p.pruned ? "1" : "0";
      drawPanel(c, base, map, p.grid, p.vmin ?? 0, p.vmax ?? 1, outline, p.cell, p.pruned,
        { diverging: p.diverging, cellSize: p.cell_size });
      c.addEventListener("click", (ev) => sendClick(c, ev));
      hoverReadout(c, readout, p, map, state);
      box.appendChild(c);
      const extras = [];
      if (p.prefix_kinds.length) extras.push(p.prefix_kinds.map((k, j) => `${k}: ${fmt(p.prefix[j])}`).join(" · "));
      if (p.exclude_query && p.self_value !== null && p.self_value !== undefined) {
        extras.push(`query's own token ${fmt(p.self_value)}: left out of the scale`);
      }
      if (extras.length) box.appendChild(el("div", "wbx-sub", extras.join(" · ")));
      box.appendChild(colourBar(p.vmin ?? 0, p.vmax ?? 1, p.units, p.diverging));
      row.appendChild(box);
    });
    root.appendChild(row);
    root.appendChild(readout);
    root.appendChild(agreementChart(state));
    root.appendChild(thumbnails(state));
    root.appendChild(latentView(model, base, pixelsOf, (id) => {
      latentPicks += 1;
      model.set("latent_pick", [id, latentPicks]);
      model.save_changes();
    }));
  }

  // layer x head thumbnails of one model; a click selects that layer and head
  function thumbnails(state) {
    const s = state.strip;
    const [L, H, gh, gw] = s.shape;
    const thumbs = bytesOf(model.get("strip"));
    const strip = el("div", "wbx-strip");
    strip.appendChild(el("div", "wbx-label", `${s.label}: every layer and head for this query (each thumbnail scaled to its own max; grey = pruned; click one to select its layer and head)`));
    const grid = el("div", "wbx-grid");
    grid.style.gridTemplateColumns = `48px repeat(${H}, ${THUMB}px)`;
    grid.appendChild(el("div", "wbx-sub", ""));
    for (let h = 0; h < H; h++) grid.appendChild(el("div", "wbx-sub", `h${h}`));
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("div", "wbx-sub", `L${s.layers[l]}`));
      const has = s.heads ? s.heads[l] : H;
      for (let h = 0; h < H; h++) {
        if (h >= has) { grid.appendChild(el("div", "wbx-nohead")); continue; } // a head this layer does not have
        const c = canvasOf(THUMB, THUMB, "wbx-thumb");
        c.dataset.layer = String(l);
        c.dataset.head = String(h);
        c.dataset.pruned = s.pruned[l][h] === 1 ? "1" : "0";
        c.title = `layer ${s.layers[l]}, head ${h}${s.pruned[l][h] === 1 ? " (pruned)" : ""}: click to select`;
        const k = (l * H + h) * gh * gw;
        const m = new Float32Array(gh * gw);
        for (let j = 0; j < gh * gw; j++) m[j] = thumbs[k + j] === 255 ? NaN : thumbs[k + j] / 254;
        drawPanel(c, null, m, [gh, gw], 0, 1, null, null, s.pruned[l][h] === 1, { gridLines: false, alpha: 1 });
        if (l === s.layer && (state.head === null || state.head === h)) c.classList.add("wbx-current");
        c.addEventListener("click", () => {
          picks += 1;
          model.set("pick", [l, h, picks]);
          model.save_changes();
        });
        grid.appendChild(c);
      }
    }
    strip.appendChild(grid);
    return strip;
  }

  // one redraw per batch of changes (image, state and buffers arrive together)
  function schedule() {
    if (pending) return;
    pending = true;
    queueMicrotask(redraw);
  }

  model.on("change:image", () => { base = imageCanvas(model); schedule(); });
  model.on("change:image_id", schedule);
  model.on("change:state", schedule);
  model.on("change:error", schedule);
  model.on("change:latents", schedule);
  base = imageCanvas(model);
  redraw();
}

export default { render };
