"""The explorer in a real browser: JupyterLab serving a notebook with the widget, in headless Debian Chromium.

Playwright drives ``/usr/bin/chromium`` (Debian's package; ``.ci/run`` installs it when missing — nothing here
downloads a browser). The test runs the notebook's cells, clicks a patch on the teacher's panel, and checks that the
query changed and that the panels' pixels changed; it saves a screenshot (``EXPLORE_SCREENSHOT`` names where,
default: the test's temporary directory); the walkthrough also switches to the explanation view. Skipped, with
the reason, only where Chromium or Playwright is missing.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]

CELLS = [
    "import torch\n"
    "from workbench.explore import explore\n"
    "from workbench.models import create_model\n"
    "import methods.far as far, methods.sparsifiner as sp\n"
    "torch.manual_seed(0)\n"
    "teacher = create_model('vit_demo').eval()\n"
    "students = {'FAR': far.replace_attention(create_model('vit_demo')).eval(),\n"
    "            'Sparsifiner': sp.replace_attention(create_model('vit_demo')).eval()}",
    "w = explore(teacher, students, images='demo:val[::400]')\nw",
]

# notebooks/07_explore.ipynb's calls on demo models: the widget, a selection from code, then (in the test) a click;
# and a SlimSwin beside its Swin with the thumbnails' model selected from code before the widget is shown
NOTEBOOK_CELLS = CELLS + ["w.state.select(image=1, query=(3, 4), layer=2, head=None)"]
SLIM_CELLS = [
    "import torch\n"
    "from workbench.explore import explore\n"
    "from workbench.models import create_model\n"
    "import methods.slimswin as ss\n"
    "torch.manual_seed(4)\n"
    "slim = ss.add_gates(create_model('swin_demo')).eval()\n"
    "masks = [m.clone() for m in ss.get_masks(slim)]\n"
    "masks[2][0, :] = False  # every head of layer 2's window 0 (the top-left one) pruned\n"
    "ss.set_mask(slim, masks)\n"
    "ws = explore(create_model('swin_demo').eval(), {'SlimSwin': slim}, images='demo:val[:2]')\n"
    "ws.state.select(strip='SlimSwin', query=(1, 1), layer=2)\n"
    "ws",
]

# the panels' pixels: a checksum over every panel canvas
PIXELS = """() => Array.from(document.querySelectorAll('canvas.wbx-map')).map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0; for (let i = 0; i < d.length; i += 1) s = (s * 31 + d[i]) % 1000000007; return s; })"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(path: Path, cells: list[str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


class Lab(NamedTuple):
    url: str  # the server's base URL
    token: str  # its token
    root: Path  # the folder it serves (the notebooks' and their kernels' working directory)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, workbench_home):
    """One JupyterLab server on a free port for this module's tests (token auth), serving a folder of their notebooks;
    each test opens its own notebook (its own kernel, shut down after the test) in a workspace of its own."""
    if not CHROMIUM.exists():
        pytest.skip("no Chromium at /usr/bin/chromium (install Debian's: apt-get install -y chromium; .ci/run does)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    root = tmp_path_factory.mktemp("lab")
    _notebook(root / "explore.ipynb", CELLS)
    _notebook(root / "walkthrough.ipynb", NOTEBOOK_CELLS)
    _notebook(root / "slimswin.ipynb", SLIM_CELLS)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "WORKBENCH_HOME": str(workbench_home), "MPLBACKEND": "Agg", "JUPYTER_CONFIG_DIR": str(root / "cfg"), "JUPYTER_RUNTIME_DIR": str(root / "runtime")}
    log = open(root / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--allow-root", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    json.loads(r.read())
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((root / "lab.log").read_text()[-2000:]) from None
                time.sleep(1)
        else:
            raise RuntimeError("JupyterLab did not start in 120 s: " + (root / "lab.log").read_text()[-2000:])
        yield Lab(url, token, root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def chromium(lab):
    """One headless Chromium for this module's tests (each gets a browser context of its own)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def _shutdown_kernels(lab: Lab) -> None:
    """Stop every kernel of the server (a test's explorer may still compute in the background)."""
    with urllib.request.urlopen(f"{lab.url}/api/kernels?token={lab.token}", timeout=10) as r:
        kernels = json.loads(r.read())
    for k in kernels:
        req = urllib.request.Request(f"{lab.url}/api/kernels/{k['id']}?token={lab.token}", method="DELETE")
        urllib.request.urlopen(req, timeout=30).close()


def _shots(tmp_path: Path) -> Path:
    """Where screenshots go: ``EXPLORE_SCREENSHOTS`` (a folder), else the test's temporary directory."""
    folder = Path(os.environ.get("EXPLORE_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _open(browser, lab: Lab, notebook: str, cells: list[str], shots: Path, width: int = 1400):
    """Open ``notebook`` in JupyterLab in a fresh browser context and workspace, run its cells, wait for the widgets;
    returns (page, console). Close it with :func:`_close`."""
    page = browser.new_context(viewport={"width": width, "height": 1300}).new_page()
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    workspace = Path(notebook).stem  # a workspace of its own: nothing of another test's notebooks is restored
    page.goto(f"{lab.url}/lab/workspaces/{workspace}/tree/{notebook}?token={lab.token}&reset", timeout=120_000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)  # the kernel is up
    page.locator(".jp-Cell .jp-InputArea-editor").first.click()
    page.keyboard.press("Escape")  # command mode: Shift+Enter runs a cell and selects the next
    for _ in cells:
        page.keyboard.press("Shift+Enter")
    try:
        page.wait_for_selector("canvas.wbx-map", timeout=int(os.environ.get("EXPLORE_RENDER_TIMEOUT_MS", 240_000)))
    except Exception:
        page.screenshot(path=str(shots / f"{notebook}-failure.png"))
        _close(page, lab)
        raise AssertionError("the widget never rendered; browser console:\n" + "\n".join(console[-30:])) from None
    return page, console


def _close(page, lab: Lab) -> None:
    page.context.close()
    _shutdown_kernels(lab)


def test_click_a_patch_in_jupyterlab(lab, chromium, tmp_path):
    shot = Path(os.environ.get("EXPLORE_SCREENSHOT", _shots(tmp_path) / "explore.png"))
    page, _ = _open(chromium, lab, "explore.ipynb", CELLS, shot.parent)
    try:
        page.wait_for_function("() => document.querySelectorAll('canvas.wbx-map').length === 3", timeout=60_000)
        query = page.locator(".wbx-query").inner_text()
        before = page.evaluate(PIXELS)
        teacher = page.locator("canvas.wbx-map[data-model='teacher']")
        box = teacher.bounding_box()
        # the top-left patch (the default query is the centre one)
        page.mouse.click(box["x"] + 0.08 * box["width"], box["y"] + 0.08 * box["height"])
        page.wait_for_function(f"() => document.querySelector('.wbx-query').innerText !== {json.dumps(query)}",
                               timeout=60_000)
        after_query = page.locator(".wbx-query").inner_text()
        after = page.evaluate(PIXELS)
        page.locator(".wbx").first.screenshot(path=str(shot))
    finally:
        _close(page, lab)
    assert query == "query: patch (3, 3)"
    assert after_query == "query: patch (0, 0)"
    assert len(before) == len(after) == 3
    assert all(b != a for b, a in zip(before, after)), (before, after)  # every panel redrawn for the new query
    assert shot.stat().st_size > 10_000


# what the page shows: the controls' values, the title's image id, and per canvas the image id of its pixels and of
# its map, and the image panel's grey levels at the centres of the 7 x 7 patch cells
SHOWN = """() => {
  const text = (sel) => { const e = document.querySelector(sel); return e ? e.innerText.trim() : null; };
  const option = (sel) => { const e = document.querySelector(sel); return e ? e.selectedOptions[0].textContent.replace(/\u00a0/g, ' ') : null; };
  const img = document.querySelector('canvas.wbx-image');
  const d = img.getContext('2d').getImageData(0, 0, img.width, img.height).data;
  const grey = [];
  for (let y = 0; y < 7; y++) for (let x = 0; x < 7; x++) {
    const py = Math.floor((y + 0.5) * img.height / 7), px = Math.floor((x + 0.5) * img.width / 7);
    grey.push(d[4 * (py * img.width + px)]);
  }
  return {
    image: text('.wbx-control-image .widget-readout'), layer: text('.wbx-control-layer .widget-readout'),
    head: option('.wbx-control-head select'), strip: option('.wbx-control-strip select'),
    title_id: text('.wbx-image-id'), query: text('.wbx-query'),
    canvases: Array.from(document.querySelectorAll('canvas.wbx-canvas')).map(c => [c.dataset.model || 'image', c.dataset.imageId, c.dataset.mapImageId]),
    subs: Array.from(document.querySelectorAll('.wbx-panel .wbx-sub')).map(e => e.innerText),
    tops: Array.from(document.querySelectorAll('canvas.wbx-canvas')).map(c => Math.round(c.getBoundingClientRect().top)),
    slider_width: document.querySelector('.wbx-control-image').getBoundingClientRect().width,
    grey };
}"""


def _expected(spec: str, image: int) -> tuple[str, np.ndarray]:
    """The id of image ``image`` of ``spec`` and its grey levels at the 7 x 7 cell centres (28 x 28 demo digits: the
    canvas pixel at a cell's centre shows image pixel 2 + 4 · cell)."""
    from workbench.data import load_images

    batch = load_images(spec, input_size=(1, 28, 28))
    return f"demo:val[{int(batch.source.indices[image])}]", np.round(batch.display[image][2::4, 2::4] * 255)


def _check_one_image(shown: dict, image_id: str, grey: np.ndarray) -> None:
    assert shown["title_id"] == image_id, shown
    assert len(shown["canvases"]) == 4  # the image and three models
    for label, pixels_of, map_of in shown["canvases"]:
        assert pixels_of == map_of == image_id, (label, pixels_of, map_of, image_id)
    assert not any("not drawn over" in s for s in shown["subs"]), shown["subs"]
    np.testing.assert_allclose(np.array(shown["grey"], float).reshape(7, 7), grey, atol=1)  # the pixels are that image's


def test_notebook_walkthrough_keeps_controls_pixels_and_maps_on_one_image(lab, chromium, tmp_path):
    """notebooks/07_explore.ipynb's calls: the widget, ``w.state.select(image=1, query=(3, 4), layer=2)`` from code,
    then a click: the sliders, the title, the pixels and every panel's map are image 1's, at a width of 1100 px."""
    shots = _shots(tmp_path)
    spec = "demo:val[::400]"
    id0, grey0 = _expected(spec, 0)
    id1, grey1 = _expected(spec, 1)
    assert id0 != id1 and not np.allclose(grey0, grey1)
    page, console = _open(chromium, lab, "walkthrough.ipynb", NOTEBOOK_CELLS, shots, width=1100)
    try:
        page.wait_for_function("() => document.querySelector('.wbx-query') && "
                               "document.querySelector('.wbx-query').innerText === 'query: patch (3, 4)'",
                               timeout=120_000)
        selected = page.evaluate(SHOWN)
        page.locator(".jp-OutputArea-output:has(.wbx)").first.screenshot(path=str(shots / "walkthrough-selected.png"))
        far = page.locator("canvas.wbx-map[data-model='FAR']").bounding_box()
        page.mouse.click(far["x"] + (5.5 / 7) * far["width"], far["y"] + (1.5 / 7) * far["height"])  # patch (1, 5)
        page.wait_for_function("() => document.querySelector('.wbx-query').innerText === 'query: patch (1, 5)'",
                               timeout=60_000)
        page.mouse.move(far["x"] + 0.5 * far["width"], far["y"] + 0.5 * far["height"])  # the value read-out
        clicked = page.evaluate(SHOWN)
        readout = page.locator(".wbx-readout").inner_text()
        page.locator(".jp-OutputArea-output:has(.wbx)").first.screenshot(path=str(shots / "walkthrough-clicked.png"))
        explained = _explanations(page, "explanations", "generic_attention", shots)  # the same image, explained
        saliency = _explanations(page, None, "saliency", shots)
    finally:
        _close(page, lab)
    for shown in (selected, clicked):
        assert (shown["image"], shown["layer"], shown["head"]) == ("1", "2", "mean over heads"), shown
        _check_one_image(shown, id1, grey1)
        assert len(set(shown["tops"])) == 1, shown["tops"]  # one row of panels at 1100 px
        assert shown["slider_width"] >= 250, shown["slider_width"]
    assert selected["query"] == "query: patch (3, 4)" and clicked["query"] == "query: patch (1, 5)"
    assert readout.startswith("FAR · key (3, 3): ") and "gradient" in readout, readout
    for shown, panels in (explained, saliency):  # the explanation view: image 1's pixels and maps, no other
        assert shown["image"] == "1" and shown["query"] == f"explainer: {panels[0][1]}", shown
        _check_one_image(shown, id1, grey1)
    (_, _, t_ok, _, _), (_, _, far_ok, far_text, far_ticks), (_, _, sp_ok, _, _) = explained[1]
    assert (t_ok, far_ok, sp_ok) == ("1", "0", "1")  # FAR's LSTM has no attention: its reason, no map
    assert "no attention" in far_text and far_ticks == "", far_text
    assert [p[2] for p in saliency[1]] == ["1", "1", "1"]
    ticks = {p[4] for p in saliency[1]}
    assert len(ticks) == 1 and "|∂ logit / ∂ pixel|" in ticks.pop(), saliency[1]  # one colour scale, with its units


# per explanation panel: model, explainer, whether it applies, the panel's text, its colour bar's ticks and units
EXPLAINED = """() => Array.from(document.querySelectorAll('canvas.wbx-explain')).map(c => [c.dataset.model,
  c.dataset.method, c.dataset.applies, c.parentElement.innerText,
  c.parentElement.querySelector('.wbx-ticks') ? c.parentElement.querySelector('.wbx-ticks').innerText : ''])"""


def _explanations(page, view: str | None, method: str, shots: Path) -> tuple[dict, list]:
    """Switch the explorer to its explanation view (``view``: the menu's label; None: already there) and ``method``;
    returns what the page shows (:data:`SHOWN`) and :data:`EXPLAINED`, and saves a screenshot."""
    if view is not None:
        page.select_option(".wbx-control-mode select", label=view)
    page.select_option(".wbx-control-method select", label=method)
    page.wait_for_function(f"""() => document.querySelectorAll('canvas.wbx-explain[data-method="{method}"]').length === 3""",
                           timeout=120_000)
    shown, panels = page.evaluate(SHOWN), page.evaluate(EXPLAINED)
    page.locator(".jp-OutputArea-output:has(.wbx)").first.screenshot(path=str(shots / f"explain-{method}.png"))
    return shown, panels


def test_slimswin_window_with_every_head_pruned_is_greyed(lab, chromium, tmp_path):
    shots = _shots(tmp_path)
    saturation = """(model) => { const c = document.querySelector(`canvas.wbx-map[data-model='${model}']`);
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let s = 0;
      for (let i = 0; i < d.length; i += 4) s += Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]);
      return [c.dataset.pruned, s / (d.length / 4)]; }"""
    page, _ = _open(chromium, lab, "slimswin.ipynb", SLIM_CELLS, shots)
    try:
        page.wait_for_function("() => document.querySelectorAll('canvas.wbx-map').length === 2", timeout=60_000)
        strip = page.evaluate("() => document.querySelector('.wbx-control-strip select').selectedOptions[0].textContent.replace(/\u00a0/g, ' ')")
        head_options = page.evaluate("() => Array.from(document.querySelector('.wbx-control-head select').options).map(o => o.textContent.replace(/\u00a0/g, ' '))")
        slim, teacher = page.evaluate(saturation, "SlimSwin"), page.evaluate(saturation, "teacher")
        thumbs = page.evaluate("""() => Array.from(document.querySelectorAll('canvas.wbx-thumb')).map(
            c => [Number(c.dataset.layer), Number(c.dataset.head), c.dataset.pruned])""")
        sub = page.locator("canvas.wbx-map[data-model='SlimSwin']").locator("xpath=..").inner_text()
        page.locator(".jp-OutputArea-output:has(.wbx)").first.screenshot(path=str(shots / "slimswin-pruned.png"))
    finally:
        _close(page, lab)
    assert strip == "SlimSwin"  # selected from code before the widget was shown
    assert head_options == ["mean over heads"] + [f"head {h}" for h in range(6)]  # layer 2 has 6 heads
    assert slim[0] == "1" and teacher[0] == "0"
    assert slim[1] < 0.3 * teacher[1], (slim, teacher)  # greyed: little colour left
    assert "all 6 heads pruned" in sub, sub
    per_layer = {l: sorted(h for ll, h, _ in thumbs if ll == l) for l in range(6)}
    assert per_layer == {l: list(range(n)) for l, n in enumerate([3, 3, 6, 6, 12, 12])}  # no thumbnails of absent heads
    assert all(p == "1" for l, _, p in thumbs if l == 2)


LATENT_CELLS = CELLS[:1] + [
    "from test_explore_latents import write_latent_store\n"
    "from workbench.data import load_images\n"
    "from pathlib import Path\n"
    "write_latent_store(Path('f.nc'), teacher, students['FAR'], load_images('demo:val[::400]', input_size=(1, 28, 28)).tensor)\n"
    "w = explore(teacher, {'FAR': students['FAR']}, images='demo:val[::400]', latents={'FAR': 'f.nc'})\n"
    "w.state.select(query=(2, 3))\n"
    "w",
]

# the latent view as shown: the listed latents and, per map canvas, its panel, latent and image id
LATENTS_SHOWN = """() => ({
  rows: Array.from(document.querySelectorAll('tr.wbx-latent-row')).map(r => [Number(r.dataset.latent),
        Array.from(r.cells).map(c => c.innerText)]),
  picked: Array.from(document.querySelectorAll('tr.wbx-picked')).map(r => Number(r.dataset.latent)),
  maps: Array.from(document.querySelectorAll('canvas.wbx-latent-map')).map(c => [c.dataset.panel, Number(c.dataset.latent), c.dataset.mapImageId]),
  image: document.querySelector('canvas.wbx-image').dataset.imageId })"""


def test_latent_view_lists_a_tokens_latents_and_shows_a_picked_one(lab, chromium, tmp_path):
    """The latent view of a (random-dictionary) crosscoder: the clicked token's latents listed with their class, the
    most active one's maps drawn over the same image; a row click shows another latent."""
    sys.path.insert(0, str(ROOT / "tests"))
    shots = _shots(tmp_path)
    cells = [c.replace("from test_explore_latents", "import sys; sys.path.insert(0, %r)\nfrom test_explore_latents"
                       % str(ROOT / "tests")) for c in LATENT_CELLS]
    _notebook(lab.root / "latents.ipynb", cells)
    page, _ = _open(chromium, lab, "latents.ipynb", cells, shots, width=1100)
    try:
        page.wait_for_selector("canvas.wbx-latent-map", timeout=120_000)
        page.wait_for_function("() => document.querySelector('.wbx-query').innerText === 'query: patch (2, 3)'",
                               timeout=60_000)
        first = page.evaluate(LATENTS_SHOWN)
        other = first["rows"][-1][0]
        page.locator(f"tr.wbx-latent-row[data-latent='{other}']").click()
        page.wait_for_function(f"() => document.querySelector('tr.wbx-picked') && "
                               f"document.querySelector('tr.wbx-picked').dataset.latent === '{other}'", timeout=60_000)
        picked = page.evaluate(LATENTS_SHOWN)
        page.locator(".jp-OutputArea-output:has(.wbx)").first.screenshot(path=str(shots / "latents.png"))
    finally:
        _close(page, lab)
    assert len(first["rows"]) >= 2, first
    assert first["picked"] == [first["rows"][0][0]]  # the most active latent is shown first
    classes = {"shared", "teacher-only", "student-only", "partial"}
    assert all(cells[1] in classes for _, cells in first["rows"]), first["rows"]
    acts = [float(cells[2]) for _, cells in first["rows"]]
    assert acts == sorted(acts, reverse=True) and acts[-1] > 0
    for shown, latent in ((first, first["rows"][0][0]), (picked, other)):
        assert [m[0] for m in shown["maps"]] == ["code", "teacher", "FAR"]
        assert all(m[1] == latent and m[2] == shown["image"] for m in shown["maps"]), shown
    assert picked["picked"] == [other]
    assert (shots / "latents.png").stat().st_size > 10_000
