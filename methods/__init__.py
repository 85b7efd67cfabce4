"""Compression methods from the five papers, plus what they share.

``methods`` never imports ``workbench``: a method exposes models, losses, schedules, pruning and
its own introspection as plain tensors; ``workbench`` turns those into named xarray Datasets.
"""
