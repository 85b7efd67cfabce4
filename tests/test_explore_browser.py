"""The explorer in a real browser: JupyterLab serving a notebook with the widget, in headless Debian Chromium.

Playwright drives ``/usr/bin/chromium`` (Debian's package; ``.ci/run`` installs it when missing — nothing here
downloads a browser). The test runs the notebook's cells, clicks a patch on the teacher's panel, and checks that the
query changed and that the panels' pixels changed; it saves a screenshot (``EXPLORE_SCREENSHOT`` names where,
default: the test's temporary directory). Skipped, with the reason, only where Chromium or Playwright is missing.
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

# the panels' pixels: a checksum over every panel canvas
PIXELS = """() => Array.from(document.querySelectorAll('canvas.wbx-canvas')).map(c => {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let s = 0; for (let i = 0; i < d.length; i += 1) s = (s * 31 + d[i]) % 1000000007; return s; })"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _notebook(path: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def lab(tmp_path, workbench_home):
    """A JupyterLab server on a free port, serving ``tmp_path`` (token auth); yields its base URL and token."""
    if not CHROMIUM.exists():
        pytest.skip("no Chromium at /usr/bin/chromium (install Debian's: apt-get install -y chromium; .ci/run does)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    _notebook(tmp_path / "explore.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "WORKBENCH_HOME": str(workbench_home), "MPLBACKEND": "Agg", "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--allow-root", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    json.loads(r.read())
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((tmp_path / "lab.log").read_text()[-2000:]) from None
                time.sleep(1)
        else:
            raise RuntimeError("JupyterLab did not start in 120 s: " + (tmp_path / "lab.log").read_text()[-2000:])
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_click_a_patch_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token = lab
    shot = Path(os.environ.get("EXPLORE_SCREENSHOT", tmp_path / "explore.png"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            console: list[str] = []
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.goto(f"{url}/lab/tree/explore.ipynb?token={token}", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_function("() => document.querySelector('.jp-Notebook-ExecutionIndicator') !== null "
                                   "|| document.querySelector('.jp-Toolbar') !== null", timeout=60_000)
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)  # the kernel is up
            page.locator(".jp-Cell .jp-InputArea-editor").first.click()
            page.keyboard.press("Escape")  # command mode: Shift+Enter runs a cell and selects the next
            for _ in CELLS:
                page.keyboard.press("Shift+Enter")
            try:
                page.wait_for_selector("canvas.wbx-canvas", timeout=int(os.environ.get("EXPLORE_RENDER_TIMEOUT_MS", 240_000)))
            except Exception:
                page.screenshot(path=str(shot.with_name("explore-failure.png")))
                raise AssertionError("the widget never rendered; browser console:\n" + "\n".join(console[-30:])) from None
            page.wait_for_function("() => document.querySelectorAll('canvas.wbx-canvas').length === 3", timeout=60_000)
            query = page.locator(".wbx-query").inner_text()
            before = page.evaluate(PIXELS)
            teacher = page.locator("canvas.wbx-canvas[data-model='teacher']")
            box = teacher.bounding_box()
            # the top-left patch (the default query is the centre one)
            page.mouse.click(box["x"] + 0.08 * box["width"], box["y"] + 0.08 * box["height"])
            page.wait_for_function(f"() => document.querySelector('.wbx-query').innerText !== {json.dumps(query)}",
                                   timeout=60_000)
            after_query = page.locator(".wbx-query").inner_text()
            after = page.evaluate(PIXELS)
            page.locator(".wbx").first.screenshot(path=str(shot))
        finally:
            browser.close()
    assert query == "query: patch (3, 3)"
    assert after_query == "query: patch (0, 0)"
    assert len(before) == len(after) == 3
    assert all(b != a for b, a in zip(before, after)), (before, after)  # every panel redrawn for the new query
    assert shot.stat().st_size > 10_000
