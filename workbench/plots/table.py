"""Tables as figures: a DataFrame, a title and notes, written as Markdown and CSV by ``workbench figures``."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

__all__ = ["Table"]


@dataclass
class Table:
    """A table figure: a DataFrame plus a title; written as Markdown and CSV."""

    frame: pd.DataFrame  # one row per model / setting
    title: str  # heading of the Markdown file
    notes: list[str] = field(default_factory=list)  # lines printed under the Markdown table

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", "", self.frame.to_markdown(index=False), ""]
        return "\n".join(lines + [f"- {n}" for n in self.notes]) + "\n"
