"""Tables readable at paper size: a wide frame is printed in parts of at most ``max_columns`` columns."""

from __future__ import annotations

import pandas as pd

from workbench.plots.table import Table


def test_wide_tables_are_printed_in_parts_repeating_the_key_column():
    frame = pd.DataFrame({"model": ["a", "b"], **{f"c{i}": [i, i + 1] for i in range(12)}})  # 13 columns
    t = Table(frame, "wide", ["a note"])
    parts = t.parts()
    assert [list(p.columns) for p in parts] == [["model", *[f"c{i}" for i in range(6)]],
                                                 ["model", *[f"c{i}" for i in range(6, 12)]]]
    md = t.to_markdown()
    assert "*Part 1 of 2*" in md and "*Part 2 of 2*" in md and md.count("| model") == 2 and "- a note" in md
    assert max(len(p.columns) for p in parts) <= 8
    narrow = Table(frame.iloc[:, :8], "narrow")
    assert len(narrow.parts()) == 1 and "Part" not in narrow.to_markdown()
