"""The applicability table of the README, generated from :func:`workbench.explain.applicability`.

``python -m workbench.explain.table`` prints it (Markdown) for the smoke-sized example of every model form the five
methods produce; ``tests/test_explain_forms.py`` checks that the README holds exactly this text, so the table is
never edited by hand.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from workbench.explain.registry import applicability

__all__ = ["FORMS", "form", "markdown"]


def _timm(name: str) -> nn.Module:
    import timm

    import methods.teachers  # noqa: F401  (registers the demo teachers with timm)

    return timm.create_model(name)


def _example(name: str, **kwargs) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from workbench.analysis import examples

        return getattr(examples, name)(**kwargs)

    return build


#: column title -> builder of the form's smoke-sized example (random weights)
FORMS: dict[str, Callable[[], nn.Module]] = {
    "ViT teacher": _example("vit"),
    "FAR": _example("far"),
    "Sparsifiner": _example("sparsifiner"),
    "Non-deep branched": _example("branched"),
    "Non-deep collapsed": _example("collapsed"),
    "Swin teacher": _example("swin"),
    "SlimSwin (gated)": _example("slimswin"),
    "SlimSwin (pruned)": _example("slimswin", pruned=True),
    "CNN teacher": lambda: _timm("cnn_demo"),
    "SA-ResNet": _example("sa_resnet"),
}


def form(title: str) -> nn.Module:
    """The eval-mode example of the form ``title`` of :data:`FORMS`, built with torch's seed 0."""
    torch.manual_seed(0)
    return FORMS[title]().eval()


def markdown(tables: dict[str, dict[str, str | None]]) -> str:
    """``{form: applicability}`` as a Markdown table (✓, or a numbered reason) followed by the reasons."""
    methods = sorted(next(iter(tables.values())))
    reasons: list[str] = []
    rows = ["| method | " + " | ".join(tables) + " |", "|---" * (len(tables) + 1) + "|"]
    for m in methods:
        cells = []
        for table in tables.values():
            why = table[m]
            if why is not None and why not in reasons:
                reasons.append(why)
            cells.append("✓" if why is None else f"({reasons.index(why) + 1})")
        rows.append(f"| `{m}` | " + " | ".join(cells) + " |")
    notes = [f"{i}. {why}" for i, why in enumerate(reasons, 1)]
    return "\n".join(rows) + "\n\nWhere a method does not apply (`applicability(model)`'s reason):\n\n" + "\n".join(notes) + "\n"


def main() -> None:
    print(markdown({title: applicability(form(title)) for title in FORMS}), end="")


if __name__ == "__main__":
    main()
