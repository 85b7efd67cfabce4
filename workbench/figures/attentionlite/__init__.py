"""AttentionLite (papers/003)'s figures: one module per role, the same names for every method.

- :mod:`.findings` — the paper's claims with the rules that test them on the figure's data;
- :mod:`.items` — its registered figures and tables with their data functions.

:func:`workbench.figures.load_all` imports every module here, so each registers its items.
"""
