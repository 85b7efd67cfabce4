"""FAR (papers/000)'s figures: one module per role, the same names for every method.

- :mod:`.findings` — the paper's claims with the rules that test them on the figure's data;
- :mod:`.findings_maps` — the rules of the token-map findings;
- :mod:`.items` — its registered figures and tables with their data functions;
- :mod:`.order` — the order-bias item (``far.order_bias``);
- :mod:`.tables` — its tables.

:func:`workbench.figures.load_all` imports every module here, so each registers its items.
"""
