"""Non-deep ViT (papers/002) as runs: one module per role, the same names for every method.

- :mod:`.budgets` — the budgets per profile;
- :mod:`.measures` — what the figures measure on its runs;
- :mod:`.run` — the registry entry (options, paper numbers) and the run function.

:func:`workbench.pipelines.load_all` imports every module here, so ``run`` registers the method.
"""
