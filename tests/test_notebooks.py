"""Execute every notebook end to end on the smoke profile (they are committed without outputs)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.notebooks

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, monkeypatch, workbench_home):
    monkeypatch.setenv("WORKBENCH_PROFILE", "smoke")
    monkeypatch.setenv("WORKBENCH_HOME", str(workbench_home))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    import nbformat  # here, not at collection: its import takes ~5 s of each xdist worker's CPU
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
