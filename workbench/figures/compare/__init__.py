"""The teacher-vs-students comparison's figures (``compare.*``).

- :mod:`.items` — its registered figures and tables with their data functions;
- :mod:`.findings` — the claims with the rules that test them on the figure's data.
"""
