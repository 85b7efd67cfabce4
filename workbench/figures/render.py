"""Draw registered figures from their stored data and write ``figures/`` with a gallery index.

Each figure becomes ``<id>.png`` and ``<id>.pdf`` (tables: ``<id>.md`` and ``<id>.csv``); ``index.md``
shows every item as a thumbnail (tables inline) with its caption, grouped by paper, and the
provenance of the data behind it folded underneath.
"""

from __future__ import annotations

import json
from pathlib import Path

from methods.io import atomic_path, atomic_write_text
from workbench.figures import FigureSpec
from workbench.figures.context import Context

__all__ = ["render", "write_index"]

PAPERS = {"workbench": "Teachers (the workbench's own)", "far": "FAR — attention replaced by BiLSTMs",
          "sparsifiner": "Sparsifiner — instance-dependent sparse attention",
          "nondeep": "Non-deep ViT — parallel branches collapsed", "attentionlite": "AttentionLite — distillation into SA-ResNets",
          "slimswin": "SlimSwin — window-head pruning", "compare": "Teacher vs compressed"}


def render(specs: list[FigureSpec], ctx: Context, out_dir: str | Path = "figures") -> list[Path]:
    """Draw each spec (its data computed or read back through ``ctx``), write its files, then rewrite ``index.md``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from workbench.plots.table import Table
    from workbench.plots.theme import set_theme

    set_theme()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for spec in specs:
        datasets = [ctx.data(d) for d in spec.data]
        result = spec.plot(*datasets)
        if isinstance(result, Table):
            files = [atomic_write_text(out_dir / f"{spec.id}.md", result.to_markdown()),
                     atomic_write_text(out_dir / f"{spec.id}.csv", result.frame.to_csv(index=False))]
        else:
            files = []
            for ext in ("png", "pdf"):
                with atomic_path(out_dir / f"{spec.id}.{ext}") as tmp:
                    result.savefig(tmp, dpi=150 if ext == "png" else None, bbox_inches="tight", format=ext)
                files.append(out_dir / f"{spec.id}.{ext}")
            plt.close(result)
        provenance = [json.loads(ds.attrs.get("sources", "[]")) for ds in datasets]
        entry = {"id": spec.id, "paper": spec.paper, "kind": spec.kind, "caption": spec.caption,
                 "files": [f.name for f in files], "data": list(spec.data), "profile": ctx.profile.name,
                 "created": [ds.attrs.get("created") for ds in datasets],
                 "versions": {k: datasets[0].attrs.get(k) for k in ("workbench_version", "torch_version", "timm_version")}
                 if datasets else {},
                 "provenance": [u for p in provenance for u in p]}
        atomic_write_text(out_dir / f".{spec.id}.json", json.dumps(entry, indent=1, default=str))
        for ds in datasets:
            ds.close()
        written += files
    write_index(out_dir)
    return written


def write_index(out_dir: Path) -> Path:
    """``index.md``: every item present in ``out_dir`` as a gallery, grouped by paper, provenance folded.

    Layout: a contents list (one line per paper, linking its section and each of its items), then per paper a
    section with every item: its id, a thumbnail linking the full-size PNG (a table inline), its caption, its files,
    and its provenance under a folded ``<details>``. Papers come in :data:`PAPERS` order, unknown ones after.
    """
    from workbench.provenance import now_iso, versions

    entries = sorted((json.loads(p.read_text()) for p in out_dir.glob(".*.json")), key=lambda e: _order(e["id"]))
    v = versions()
    lines = ["# Figures", "", f"Regenerate with `workbench figures --all`. Index written {now_iso()} by workbench "
             f"{v['workbench_version']} (torch {v['torch_version']}, timm {v['timm_version']}).", ""]
    papers = list(dict.fromkeys([p for p in PAPERS if any(e["paper"] == p for e in entries)]
                                + [e["paper"] for e in entries]))
    lines += ["## Contents", ""]
    for paper in papers:
        items = " · ".join(f"[{e['id'].partition('.')[2] or e['id']}](#{_anchor(e['id'])})"
                           for e in entries if e["paper"] == paper)
        lines.append(f"- [{PAPERS.get(paper, paper)}](#{_anchor(paper)}): {items}")
    lines.append("")
    for paper in papers:
        lines += [f'<a id="{_anchor(paper)}"></a>', "", f"## {PAPERS.get(paper, paper)}", ""]
        for e in (e for e in entries if e["paper"] == paper):
            lines += [f'<a id="{_anchor(e["id"])}"></a>', "", f"### `{e['id']}` ({e['kind']}, profile {e['profile']})", ""]
            png = next((f for f in e["files"] if f.endswith(".png")), None)
            md = next((f for f in e["files"] if f.endswith(".md")), None)
            if png:
                lines += [f'<a href="{png}"><img src="{png}" width="420" alt="{e["id"]}: {_alt(e["caption"])}"></a>', ""]
            elif md and (out_dir / md).exists():
                lines += [(out_dir / md).read_text().replace("### ", "**", 1).replace("\n", "**\n", 1), ""]
            lines += [e["caption"], "", "Files: " + ", ".join(f"[{f}]({f})" for f in e["files"]), ""]
            lines += ["<details><summary>provenance</summary>", ""]
            lines += [f"- data: {', '.join(e.get('data', []))}; created {', '.join(map(str, e.get('created', [])))}; "
                      + ", ".join(f"{k} {val}" for k, val in (e.get("versions") or {}).items())]
            for p in e["provenance"]:
                lines.append("- " + "; ".join(f"{k}: `{val}`" for k, val in p.items() if val is not None))
            lines += ["", "</details>", ""]
    return atomic_write_text(out_dir / "index.md", "\n".join(lines))


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
