// workbench.explore: the view of the explorer widget (anywidget ESM; shipped in the Python package, no CDN).
// Python owns all logic (workbench/explore/state.py); this file draws the payload it sends and reports clicks.
// Buffers: `panels` float16 maps (per panel, row-major on its grid), `outlines` uint8 0/1, `strip` uint8 thumbnails
// (255 = no value), `strip_max` float16 per-thumbnail maxima, `image` uint8 (H, W[, 3]).

const PANEL = 224; // panel size in CSS pixels
const THUMB = 44;

// viridis, 9 stops, linearly interpolated
const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
  [92, 200, 99], [170, 220, 50], [253, 231, 37]];

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

// the image as an offscreen canvas (grey or RGB)
function imageCanvas(model) {
  const shape = model.get("image_shape") || [];
  const data = bytesOf(model.get("image"));
  if (shape.length < 2 || !data.length) return null;
  const [h, w] = shape;
  const rgb = shape.length === 3;
  const c = document.createElement("canvas");
  c.width = w;
  c.height = h;
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

function drawPanel(canvas, base, map, grid, vmin, vmax, outline, cell, pruned) {
  const ctx = canvas.getContext("2d");
  const size = canvas.width;
  ctx.imageSmoothingEnabled = false;
  ctx.clearRect(0, 0, size, size);
  if (base) ctx.drawImage(base, 0, 0, size, size);
  const [gh, gw] = grid;
  const ch = size / gh, cw = size / gw;
  if (map) {
    ctx.globalAlpha = 0.75;
    for (let y = 0; y < gh; y++) {
      for (let x = 0; x < gw; x++) {
        const v = map[y * gw + x];
        if (Number.isNaN(v)) continue;
        const [r, g, b] = colour((v - vmin) / ((vmax - vmin) || 1));
        ctx.fillStyle = `rgb(${r},${g},${b})`;
        ctx.fillRect(x * cw, y * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    ctx.globalAlpha = 1;
  }
  ctx.strokeStyle = "rgba(255,255,255,0.18)";
  ctx.lineWidth = 1;
  for (let y = 1; y < gh; y++) { ctx.beginPath(); ctx.moveTo(0, y * ch); ctx.lineTo(size, y * ch); ctx.stroke(); }
  for (let x = 1; x < gw; x++) { ctx.beginPath(); ctx.moveTo(x * cw, 0); ctx.lineTo(x * cw, size); ctx.stroke(); }
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
    ctx.strokeStyle = "red";
    ctx.lineWidth = 2.5;
    ctx.strokeRect(cell[1] * cw + 1, cell[0] * ch + 1, cw - 2, ch - 2);
  }
  if (pruned) {
    ctx.fillStyle = "rgba(128,128,128,0.7)";
    ctx.fillRect(0, 0, size, size);
    ctx.fillStyle = "white";
    ctx.font = "bold 14px sans-serif";
    ctx.fillText("pruned", size / 2 - 24, size / 2);
  }
}

function colourBar(vmin, vmax, units) {
  const box = el("div", "wbx-cbar");
  const c = document.createElement("canvas");
  c.width = PANEL;
  c.height = 10;
  const ctx = c.getContext("2d");
  for (let x = 0; x < PANEL; x++) {
    const [r, g, b] = colour(x / (PANEL - 1));
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

function agreementChart(state) {
  const box = el("div", "wbx-agree");
  const names = Object.keys(state.agreement || {});
  if (!names.length) return box;
  const layers = state.ref_layers.length;
  const W = 400, H = 110, L = 34, B = 22, PW = W - L - 110; // plot width; the legend at its right
  const colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
  for (const metric of ["js", "topk"]) {
    const c = document.createElement("canvas");
    c.width = W;
    c.height = H;
    c.className = "wbx-chart";
    c.dataset.metric = metric;
    const ctx = c.getContext("2d");
    ctx.fillStyle = "white";
    ctx.fillRect(0, 0, W, H);
    ctx.strokeStyle = "#888";
    ctx.strokeRect(L, 4, PW, H - B - 4);
    ctx.fillStyle = "#333";
    ctx.font = "10px sans-serif";
    ctx.fillText(metric === "js" ? "JS (bits)" : "top-10% overlap", L + 4, 14);
    ctx.fillText("1", L - 10, 10);
    ctx.fillText("0", L - 10, H - B);
    ctx.fillText("layer", L + PW / 2 - 10, H - 4);
    const px = (i) => L + (layers > 1 ? i / (layers - 1) : 0.5) * (PW - 6) + 3;
    const py = (v) => 4 + (1 - v) * (H - B - 8);
    names.forEach((name, n) => {
      const vals = state.agreement[name][metric];
      ctx.strokeStyle = colours[n % colours.length];
      ctx.fillStyle = colours[n % colours.length];
      ctx.beginPath();
      let started = false;
      vals.forEach((v, i) => {
        if (v === null) { started = false; return; }
        if (!started) ctx.moveTo(px(i), py(v)); else ctx.lineTo(px(i), py(v));
        started = true;
      });
      ctx.stroke();
      vals.forEach((v, i) => { if (v !== null) ctx.fillRect(px(i) - 2, py(v) - 2, 4, 4); });
      ctx.fillText(name, L + PW + 8, 14 + 12 * n);
    });
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

function render({ model, el: root }) {
  root.classList.add("wbx");
  let base = null;
  let clicks = 0;

  function redraw() {
    const state = model.get("state") || {};
    root.innerHTML = "";
    const err = model.get("error");
    if (err) root.appendChild(el("div", "wbx-error", err));
    if (!state.panels) return;
    const head = state.head === null ? "mean over heads" : `head ${state.head}`;
    const title = el("div", "wbx-title");
    title.appendChild(el("span", "wbx-query", `query: ${state.query_label}`));
    title.appendChild(el("span", "", ` · ${state.image_id} · ${head} · click a patch on any panel`));
    root.appendChild(title);
    const row = el("div", "wbx-row");
    const maps = halves(model.get("panels"));
    const outlines = bytesOf(model.get("outlines"));
    let off = 0, ooff = 0;
    state.panels.forEach((p, i) => {
      const n = p.grid[0] * p.grid[1];
      const map = maps.subarray(off, off + n);
      off += n;
      let outline = null;
      if (p.outline) { outline = outlines.subarray(ooff, ooff + n); ooff += n; }
      const box = el("div", "wbx-panel");
      box.appendChild(el("div", "wbx-label", `${p.label} · ${p.measure}`));
      box.appendChild(el("div", "wbx-sub", `layer ${p.layer}${p.note ? " · " + p.note : ""}`));
      const c = document.createElement("canvas");
      c.width = PANEL;
      c.height = PANEL;
      c.className = "wbx-canvas";
      c.dataset.model = p.label;
      drawPanel(c, base, map, p.grid, p.vmin ?? 0, p.vmax ?? 1, outline, p.cell, p.pruned);
      c.addEventListener("click", (ev) => {
        const r = c.getBoundingClientRect();
        const fy = (ev.clientY - r.top) / r.height, fx = (ev.clientX - r.left) / r.width;
        clicks += 1;
        model.set("click", [fy, fx, clicks]);
        model.save_changes();
      });
      box.appendChild(c);
      if (p.prefix_kinds.length) {
        box.appendChild(el("div", "wbx-sub", p.prefix_kinds.map((k, j) => `${k}: ${fmt(p.prefix[j])}`).join(" · ")));
      }
      box.appendChild(colourBar(p.vmin ?? 0, p.vmax ?? 1, p.units));
      row.appendChild(box);
    });
    root.appendChild(row);
    root.appendChild(agreementChart(state));
    // layer x head thumbnails of one model
    const s = state.strip;
    const [L, H, gh, gw] = s.shape;
    const thumbs = bytesOf(model.get("strip"));
    const strip = el("div", "wbx-strip");
    strip.appendChild(el("div", "wbx-label", `${s.label}: every layer and head for this query (each thumbnail scaled to its own max; grey = pruned)`));
    const grid = el("div", "wbx-grid");
    grid.style.gridTemplateColumns = `40px repeat(${H}, ${THUMB}px)`;
    grid.appendChild(el("div", "wbx-sub", ""));
    for (let h = 0; h < H; h++) grid.appendChild(el("div", "wbx-sub", `h${h}`));
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("div", "wbx-sub", `L${s.layers[l]}`));
      for (let h = 0; h < H; h++) {
        const c = document.createElement("canvas");
        c.width = THUMB;
        c.height = THUMB;
        const k = (l * H + h) * gh * gw;
        const m = new Float32Array(gh * gw);
        for (let j = 0; j < gh * gw; j++) m[j] = thumbs[k + j] === 255 ? NaN : thumbs[k + j] / 254;
        drawPanel(c, null, m, [gh, gw], 0, 1, null, null, s.pruned[l][h] === 1);
        if (l === state.layer && (state.head === null || state.head === h)) c.className = "wbx-current";
        grid.appendChild(c);
      }
    }
    strip.appendChild(grid);
    root.appendChild(strip);
  }

  function newImage() {
    base = imageCanvas(model);
    redraw();
  }

  model.on("change:image", newImage);
  model.on("change:state", redraw);
  model.on("change:error", redraw);
  newImage();
}

export default { render };
