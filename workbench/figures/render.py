"""Draw registered figures from their stored data and write ``figures/`` with a gallery index.

Each figure becomes ``<id>.png`` (and ``<id>.pdf`` with ``--pdf``; tables: ``<id>.md`` and ``<id>.csv``); ``index.md``
shows every item as a thumbnail (tables inline) with its caption, grouped by paper, and the
provenance of the data behind it folded underneath.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from workbench.figures import FigureSpec
from workbench.figures.context import Context
from workbench.runtime import atomic_path, atomic_write_text

__all__ = ["FORMATS", "BackgroundDraw", "render", "draw", "draw_all", "write_index", "finding_text", "findings_table"]

#: Image formats of a figure by default: PNG (150 dpi). ``workbench figures --pdf`` adds vector PDFs (about 40% more
#: drawing time, measured over six of the largest figures).
FORMATS: tuple[str, ...] = ("png",)

def render(specs: list[FigureSpec], ctx: Context, out_dir: str | Path = "figures", *, reuse: bool = True,
           index: bool = True, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Draw each spec (its data computed or read back through ``ctx``), write its files, then rewrite ``index.md``.

    Args:
        reuse: keep a figure whose files exist and whose data stores and plotting code are the ones it was drawn from
            (a warm ``workbench figures`` only redraws what changed).
        index: rewrite ``index.md`` at the end.
        formats: image formats of a figure (``png``; add ``pdf`` for vector files).

    Returns:
        The files written (reused figures' files are not listed).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for spec in specs:
        written += draw(spec, ctx, out_dir, reuse=reuse, formats=formats)
    if index:
        write_index(out_dir)
    return written


def _code_hash(spec: FigureSpec) -> str:
    """Hash of the plot's and the finding test's modules and the plot modules: what decides how a stored Dataset is drawn."""
    import hashlib
    import sys

    from workbench import plots

    fns = [spec.plot] + ([spec.finding.test] if spec.finding else [])  # the verdict is drawn too
    files = [Path(sys.modules[f.__module__].__file__) for f in fns if f.__module__ in sys.modules]
    files += sorted(Path(plots.__file__).parent.glob("*.py"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _fingerprint(spec: FigureSpec, ctx: Context, formats: tuple[str, ...] = ("png",)) -> dict | None:
    """What a drawn figure depends on: its data stores (by modification time) and the code; None if a store is missing."""
    stamps = {}
    for d in spec.data:
        path = ctx.data_path(d)
        if not path.exists():
            return None
        stamps[d] = path.stat().st_mtime_ns
    return {"data": stamps, "code": _code_hash(spec), "profile": ctx.profile.name,
            **({"formats": list(formats)} if tuple(formats) != ("png",) else {})}


def draw(spec: FigureSpec, ctx: Context, out_dir: Path, *, reuse: bool = True,
         formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """Draw one figure and write its files and index entry; nothing if ``reuse`` and it is up to date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.plots.table import Table
    from workbench.plots.theme import mark_random_init, set_theme
    from workbench.provenance import RANDOM_INIT

    entry_path = out_dir / f".{spec.id}.json"
    before = _fingerprint(spec, ctx, formats)
    if reuse and before is not None and entry_path.exists():
        old = json.loads(entry_path.read_text())
        if old.get("fingerprint") == before and all((out_dir / f).exists() for f in old.get("files", [])):
            return []
    set_theme()
    datasets = [ctx.data(d) for d in spec.data]
    provenance = [json.loads(ds.attrs.get("sources", "[]")) for ds in datasets]
    untrained = sorted({str(u.get("model_name")) for p in provenance for u in p if u.get("weights") == RANDOM_INIT})
    result = mark_random_init(spec.plot(*datasets), untrained)
    if isinstance(result, Table):
        files = [atomic_write_text(out_dir / f"{spec.id}.md", result.to_markdown()),
                 atomic_write_text(out_dir / f"{spec.id}.csv", result.frame.to_csv(index=False))]
    else:
        files = []
        for ext in formats:
            with atomic_path(out_dir / f"{spec.id}.{ext}") as tmp:
                result.savefig(tmp, dpi=150 if ext == "png" else None, bbox_inches="tight", format=ext)
            files.append(out_dir / f"{spec.id}.{ext}")
        plt.close(result)
    verdict = spec.verdict(*datasets)
    finding = None if verdict is None else {"claim": spec.finding.claim, "paper_value": spec.finding.paper_value,
                                            "status": verdict.status, "statistic": verdict.statistic,
                                            "reason": verdict.reason}
    entry = {"id": spec.id, "paper": spec.paper, "kind": spec.kind, "caption": spec.caption, "finding": finding,
             "files": [f.name for f in files], "data": list(spec.data), "profile": ctx.profile.name,
             "created": [ds.attrs.get("created") for ds in datasets],
             "versions": {k: datasets[0].attrs.get(k) for k in ("workbench_version", "torch_version", "timm_version")}
             if datasets else {},
             "provenance": [u for p in provenance for u in p], "random_init": untrained,
             "fingerprint": _fingerprint(spec, ctx, formats)}
    atomic_write_text(entry_path, json.dumps(entry, indent=1, default=str))
    for ds in datasets:
        ds.close()
    return files


def stale(spec: FigureSpec, ctx: Context, out_dir: Path, formats: tuple[str, ...] = FORMATS) -> bool:
    """Whether ``spec`` must be drawn: its files, entry, data stores, plotting code or formats changed since it was drawn."""
    entry_path = out_dir / f".{spec.id}.json"
    now = _fingerprint(spec, ctx, formats)
    if now is None or not entry_path.exists():
        return True
    old = json.loads(entry_path.read_text())
    return old.get("fingerprint") != now or not all((out_dir / f).exists() for f in old.get("files", []))


def _todo(specs: list[FigureSpec], ctx: Context, out_dir: Path, reuse: bool, formats: tuple[str, ...],
          on_done: Callable[[str], None] | None) -> list[FigureSpec]:
    """The specs to draw (all, unless ``reuse``); ``on_done`` hears of the others at once."""
    todo = [s for s in specs if not reuse or stale(s, ctx, out_dir, formats)]
    for s in specs:
        if s not in todo and on_done:
            on_done(s.id)
    return todo


def draw_all(specs: list[FigureSpec], profile: str, out_dir: str | Path, *, jobs: int = 1, device: str = "auto",
             reuse: bool = True, log: Callable[[str], None] = print,
             on_done: Callable[[str], None] | None = None, formats: tuple[str, ...] = FORMATS,
             data: str | None = None, overrides=None) -> tuple[list[Path], int]:
    """Draw the specs that need it (all, unless ``reuse``) in ``jobs`` spawned processes, then rewrite ``index.md``
    (``data``, ``overrides``: those of the preparation, whose stores the figures read).

    Returns:
        (files written, number of figures reused as they were).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(profile, device, False, log=log, data=data, overrides=overrides)  # drawing only reads the stores
    todo = _todo(specs, ctx, out_dir, reuse, formats, on_done)
    written: list[Path] = []
    if jobs <= 1 or len(todo) <= 2:
        for spec in todo:
            written += draw(spec, ctx, out_dir, reuse=False, formats=formats)
            if on_done:
                on_done(spec.id)
    else:
        written, _ = BackgroundDraw(todo, profile, out_dir, jobs=jobs, device=device, reuse=False, formats=formats,
                                    on_done=on_done, data=data, overrides=overrides).result()
    write_index(out_dir)
    return written, len(specs) - len(todo)


class BackgroundDraw:
    """Draws ``specs`` (those that need it) in ``jobs`` spawned processes while the caller goes on.

    ``workbench figures`` starts one (one process) when only the timing steps are left: they run in the main process
    with no training beside them, and drawing, single-threaded, takes the otherwise idle core. The figures are handed
    to the workers one at a time, so once the timing steps are done the caller draws what is still waiting itself,
    beside the worker, instead of leaving a core idle (:meth:`finish`, which also waits for the workers' figures and
    rewrites ``index.md``; :meth:`result` only waits). The pool is the preparation's kind
    (:func:`workbench.figures.schedule.spawn_pool`).
    """

    def __init__(self, specs: list[FigureSpec], profile: str, out_dir: str | Path, *, jobs: int = 1,
                 device: str = "auto", reuse: bool = True, formats: tuple[str, ...] = FORMATS,
                 on_done: Callable[[str], None] | None = None, data: str | None = None, overrides=None):
        import collections
        import threading

        from workbench.figures.schedule import spawn_pool

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.where, self.formats = (profile, device, data, overrides), formats
        todo = _todo(specs, _reader(*self.where), self.out_dir, reuse, formats, on_done)
        self.reused, self.on_done = len(specs) - len(todo), on_done
        self.waiting = collections.deque(todo)  # not yet handed to a worker (nor taken by the caller)
        self.pending: dict[str, object] = {}  # spec id -> AsyncResult, in the order handed out
        self.failed = False
        self.lock = threading.Lock()  # the pool's result thread hands out the next figure while the caller takes
        self.pool = spawn_pool(jobs) if todo else None
        for _ in range(jobs):
            self._hand_out()

    def _hand_out(self, *_) -> None:
        """Give the next waiting figure to the pool (called again by each finished one)."""
        with self.lock:
            if not self.waiting or self.failed:
                return
            spec = self.waiting.popleft()
            self.pending[spec.id] = self.pool.apply_async(
                _draw_in_worker, (spec.id, spec.plot.__module__, self.where, str(self.out_dir), self.formats),
                callback=self._hand_out, error_callback=self._stop)

    def _stop(self, _err) -> None:
        with self.lock:
            self.failed = True  # result() re-raises the error

    def take(self) -> FigureSpec | None:
        """A figure no worker has started, for the caller to draw itself (None when none is left)."""
        with self.lock:
            return self.waiting.popleft() if self.waiting and not self.failed else None

    def cancel(self) -> None:
        """Stop drawing (the preparation failed): the workers are terminated (figure files are written atomically, so
        a figure being drawn leaves nothing half-written)."""
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def result(self) -> tuple[list[Path], int]:
        """(files written, number of figures reused as they were), once every figure handed to the workers is drawn
        (call :meth:`take` until None first, or the waiting ones are drawn here); re-raises a failure."""
        written: list[Path] = []
        done: set[str] = set()
        try:
            while True:
                with self.lock:
                    todo = [(i, r) for i, r in self.pending.items() if i not in done]
                    if not todo and (not self.waiting or self.failed):
                        break
                if not todo:  # every handed-out figure is drawn and some wait: the workers are idle
                    self._hand_out()
                    continue
                for spec_id, res in todo:
                    written += [Path(f) for f in res.get()]
                    done.add(spec_id)
                    if self.on_done:
                        self.on_done(spec_id)
        except BaseException:
            self.cancel()
            raise
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
        return written, self.reused

    def finish(self) -> tuple[list[Path], int]:
        """Draw the figures no worker has started yet here, beside the workers, wait for theirs and rewrite
        ``index.md``: (files written, number of figures reused as they were)."""
        ctx = _reader(*self.where)
        here: list[Path] = []
        try:
            while (spec := self.take()) is not None:
                here += draw(spec, ctx, self.out_dir, reuse=False, formats=self.formats)
                if self.on_done:
                    self.on_done(spec.id)
        except BaseException:
            self.cancel()
            raise
        written, reused = self.result()
        write_index(self.out_dir)
        return here + written, reused


def _reader(profile: str, device: str, data: str | None, overrides) -> Context:
    """A quiet Context that only reads what the preparation stored (on ``data``, with ``overrides``)."""
    return Context(profile, device, False, log=lambda _: None, data=data, overrides=overrides)


def _draw_in_worker(spec_id: str, module: str, where: tuple, out_dir: str, formats: tuple[str, ...]) -> list[str]:
    """Draw one figure in a worker; ``module``: where it is registered (a test's, a user's module: a spawned worker
    starts with only the package's figures); ``where``: (profile, device, data, overrides) of its :func:`_reader`."""
    import importlib

    from workbench.figures import get

    importlib.import_module(module)
    (spec,) = get([spec_id])
    return [str(f) for f in draw(spec, _reader(*where), Path(out_dir), reuse=False, formats=formats)]


def write_index(out_dir: Path) -> Path:
    """``index.md``: every item present in ``out_dir`` as a gallery, grouped by paper, provenance folded.

    Layout: a contents list (one line per paper, linking its section and each of its items), then per paper a
    section with every item: its id, a thumbnail linking the full-size PNG (a table inline), its caption, its files,
    and its provenance under a folded ``<details>``. Papers come in :func:`~workbench.figures.paper_titles` order (the
    registered figure groups and methods), unknown ones after.
    """
    from workbench.provenance import now_iso, versions

    entries = sorted((json.loads(p.read_text()) for p in out_dir.glob(".*.json")), key=lambda e: _order(e["id"]))
    v = versions()
    lines = ["# Figures", "", f"Regenerate with `workbench figures --all`. Index written {now_iso()} by workbench "
             f"{v['workbench_version']} (torch {v['torch_version']}, timm {v['timm_version']}).", ""]
    from workbench.figures import paper_titles

    titles = paper_titles()
    papers = list(dict.fromkeys([p for p in titles if any(e["paper"] == p for e in entries)]
                                + [e["paper"] for e in entries]))
    lines += findings_table(entries)
    lines += ["## Contents", ""]
    for paper in papers:
        items = " · ".join(f"[{e['id'].partition('.')[2] or e['id']}](#{_anchor(e['id'])})"
                           for e in entries if e["paper"] == paper)
        lines.append(f"- [{titles.get(paper, paper)}](#{_anchor(paper)}): {items}")
    lines.append("")
    for paper in papers:
        lines += [f'<a id="{_anchor(paper)}"></a>', "", f"## {titles.get(paper, paper)}", ""]
        for e in (e for e in entries if e["paper"] == paper):
            untrained = (f" — **random-init weights: {', '.join(e['random_init'])}** (untrained)"
                         if e.get("random_init") else "")
            lines += [f'<a id="{_anchor(e["id"])}"></a>', "",
                      f"### `{e['id']}` ({e['kind']}, profile {e['profile']}){untrained}", ""]
            png = next((f for f in e["files"] if f.endswith(".png")), None)
            md = next((f for f in e["files"] if f.endswith(".md")), None)
            if png:
                lines += [f'<a href="{png}"><img src="{png}" width="420" alt="{e["id"]}: {_alt(e["caption"])}"></a>', ""]
            elif md and (out_dir / md).exists():
                lines += [(out_dir / md).read_text().replace("### ", "**", 1).replace("\n", "**\n", 1), ""]
            lines += [e["caption"] + finding_text(e.get("finding")), "", "Files: " + ", ".join(f"[{f}]({f})" for f in e["files"]), ""]
            lines += ["<details><summary>provenance</summary>", ""]
            lines += [f"- data: {', '.join(e.get('data', []))}; created {', '.join(map(str, e.get('created', [])))}; "
                      + ", ".join(f"{k} {val}" for k, val in (e.get("versions") or {}).items())]
            for p in e["provenance"]:
                lines.append("- " + "; ".join(f"{k}: `{val}`" for k, val in p.items() if val is not None))
            lines += ["", "</details>", ""]
    return atomic_write_text(out_dir / "index.md", "\n".join(lines))


def finding_text(finding: dict | None) -> str:
    """The caption's last sentences for an item with a paper finding: the claim, the demo's statistic, the verdict."""
    if not finding:
        return ""
    why = f" — {finding['reason']}" if finding.get("reason") else ""
    return (f" **Paper:** {finding['claim']} ({finding['paper_value']}). **Demo:** {finding['statistic']}. "
            f"**Verdict: {finding['status']}**{why}.")


def findings_table(entries: list[dict]) -> list[str]:
    """Lines of the table opening ``index.md``: one row per paper claim (paper value, demo value, verdict)."""
    rows = [e for e in entries if e.get("finding")]
    if not rows:
        return []
    counts = {s: sum(e["finding"]["status"] == s for e in rows) for s in ("shown", "partly", "not shown")}
    lines = ["## Findings", "", f"What the demo reproduces, computed from each item's own data: {counts['shown']} shown, "
             f"{counts['partly']} partly, {counts['not shown']} not shown (of {len(rows)} items with a paper claim).", "",
             "| item | paper's finding | paper | demo | verdict |", "|---|---|---|---|---|"]
    for e in rows:
        f = e["finding"]
        cell = lambda t: str(t).replace("|", "\\|").replace("\n", " ")
        verdict = f["status"] + (f" ({cell(f['reason'])})" if f.get("reason") else "")
        lines.append(f"| [`{e['id']}`](#{_anchor(e['id'])}) | {cell(f['claim'])} | {cell(f['paper_value'])} | "
                     f"{cell(f['statistic'])} | {verdict} |")
    return lines + [""]


def _order(fig_id: str) -> tuple:
    """Sort key: paper, then figures before tables, then numbers in numeric order (fig2 before fig10)."""
    import re

    paper, _, rest = fig_id.partition(".")
    return (paper, rest.startswith("table"), [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", rest)])


def _anchor(text: str) -> str:
    """An HTML id for a paper or figure id (``far.fig4`` -> ``far-fig4``)."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text)


def _alt(caption: str, words: int = 12) -> str:
    short = " ".join(caption.split()[:words])
    return short.replace('"', "'") + ("…" if len(caption.split()) > words else "")
