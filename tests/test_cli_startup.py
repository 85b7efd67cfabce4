"""The command line starts fast: torch, timm and the registries are imported only by the commands that need them.

Timings are not asserted here (benchmarks measure them); what makes ``workbench --help`` fast is: which modules a
command imports, checked in a fresh interpreter. Also: the help's examples agree with the README.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "timm", "methods", "workbench.pipelines", "workbench.analysis", "workbench.models")


def _imported_after(code: str, tmp_path) -> dict:
    """Run ``code`` in a fresh interpreter; return which HEAVY modules it imported and what it printed."""
    probe = ("import io, contextlib, json, sys\nout = io.StringIO()\nrc = None\n"
             "with contextlib.redirect_stdout(out):\n"
             + "".join(f"    {line}\n" for line in code.splitlines())
             + f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules], 'rc': rc, "
               f"'out': out.getvalue()}}))\n")
    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_no_torch(tmp_path):
    assert _imported_after("import workbench.cli", tmp_path)["loaded"] == []


def test_top_level_help_imports_no_torch_and_lists_every_command(tmp_path):
    got = _imported_after("from workbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n"
                          "    rc = e.code", tmp_path)
    assert got["loaded"] == [] and got["rc"] == 0
    for command in ("info", "train", "analyze", "compare", "inspect", "figures", "run"):
        assert re.search(rf"^\s+{command}\s", got["out"], re.M), command


def test_figures_list_imports_no_torch(tmp_path):
    got = _imported_after("from workbench.cli import main\nrc = main(['figures', '--list'])", tmp_path)
    assert got["rc"] == 0 and "teacher.fig1" in got["out"]
    assert not {"torch", "timm", "methods"} & set(got["loaded"]), got["loaded"]


def test_resolving_the_device_imports_torch_but_not_timm(tmp_path):
    """A process that only needs its device or rank (a schedule worker, a store reader) reaches ``methods.launch``
    through ``workbench.runtime``, not the training loop (``methods.train``, which imports timm)."""
    got = _imported_after("from workbench.runtime import cpu_threads, is_main, resolve_device\n"
                          "with cpu_threads(1):\n    rc = [str(resolve_device('cpu')), is_main()]", tmp_path)
    assert got["rc"] == ["cpu", True]
    assert "torch" in got["loaded"] and "timm" not in got["loaded"], got["loaded"]


def test_a_command_builds_its_registry_flags(capsys):
    """Subcommand help still lists the flags that come from the method registry."""
    from workbench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "slimswin", "--help"])
    assert e.value.code == 0 and "--ratio" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0 and "--arch" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["nope"])
    assert e.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def _example_commands() -> list[list[str]]:
    from workbench.cli import EXAMPLES

    return [shlex.split(line) for text in EXAMPLES.values() for line in text.split("\n")]


def test_examples_never_analyse_random_weights():
    """Every example that names a timm model (not a run, not a demo teacher) gives its weights."""
    checked = {"run": 0, "timm name": 0}
    for argv in _example_commands():
        if argv[1] not in ("analyze", "compare"):
            continue
        flag = "--model" if argv[1] == "analyze" else "--teacher"
        model = argv[argv.index(flag) + 1]
        if not model.startswith("teacher-"):
            assert "--checkpoint" in argv, " ".join(argv)
        checked["run" if model.startswith("teacher-") else "timm name"] += 1
    assert checked["run"] and checked["timm name"], checked  # the rule met both kinds of example


def test_run_examples_name_the_readme_runs():
    """``workbench run`` examples pass the options the README passes (``--ratio 1/3``, not a new run at 0.33)."""
    readme = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("workbench run "):
            argv = shlex.split(line.split("#")[0])
            readme.setdefault(argv[2], argv)  # the first: the README's runs section (later ones show other teachers)
    compared = []
    for argv in _example_commands():
        if argv[:2] != ["workbench", "run"]:
            continue
        mine = dict(zip(argv[3::2], argv[4::2]))
        theirs = dict(zip(readme[argv[2]][3::2], readme[argv[2]][4::2]))
        shared = set(mine) & set(theirs)
        assert {k: mine[k] for k in shared} == {k: theirs[k] for k in shared}, " ".join(argv)
        compared += [f"{argv[2]} {k}" for k in shared]
    assert len(readme) >= 5 and "slimswin --ratio" in compared, compared  # every method's README line; a real option


def test_inspect_imports_no_torch(tmp_path):
    import xarray as xr

    from workbench.provenance import DataSource, ModelSource, stamp
    from workbench.store import save

    path = save(stamp(xr.Dataset({"v": ("sample", [1.0, 2.0])}), ModelSource("vit_demo", run="r"),
                      DataSource("demo:val", (3, 4))), tmp_path / "s.nc")
    got = _imported_after(f"from workbench.cli import main\nrc = main(['inspect', {str(path)!r}])", tmp_path)
    assert got["rc"] == 0 and "weights:" in got["out"]
    assert not {"torch", "timm"} & set(got["loaded"]), got["loaded"]  # (methods.io: atomic writes, no torch)
