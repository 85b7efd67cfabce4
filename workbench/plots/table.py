"""Tables as figures: a DataFrame, a title and notes, written as Markdown and CSV by ``workbench figures``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

__all__ = ["Table"]


@dataclass
class Table:
    """A table figure: a DataFrame plus a title; written as Markdown and CSV."""

    frame: pd.DataFrame  # one row per model / setting
    title: str  # heading of the Markdown file
    notes: list[str] = field(default_factory=list)  # lines printed under the Markdown table
    max_columns: int = 8  # at most this many columns per printed table (readable at paper size); wider frames are
    # printed as consecutive parts, each repeating the key columns (the CSV keeps the whole frame)
    key_columns: int = 1  # leading columns that name a row (model, setting), repeated in every part

    def parts(self) -> list[pd.DataFrame]:
        """The frame cut into column groups of at most ``max_columns`` (key columns repeated), balanced in width."""
        cols = list(self.frame.columns)
        if len(cols) <= self.max_columns:
            return [self.frame]
        key, rest = cols[: self.key_columns], cols[self.key_columns:]
        per = max(1, self.max_columns - len(key))
        n = math.ceil(len(rest) / per)
        per = math.ceil(len(rest) / n)  # as even as possible: 12 columns -> 6 + 6, not 7 + 5
        return [self.frame[key + rest[i * per:(i + 1) * per]] for i in range(n)]

    def to_markdown(self) -> str:
        parts = self.parts()
        lines = [f"### {self.title}", ""]
        for i, part in enumerate(parts):
            if len(parts) > 1:
                lines += [f"*Part {i + 1} of {len(parts)}*", ""]
            lines += [part.to_markdown(index=False), ""]
        return "\n".join(lines + [f"- {n}" for n in self.notes]) + "\n"
