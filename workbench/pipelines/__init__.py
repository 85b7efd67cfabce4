"""Pipelines: data + model + method -> a run. One module per method, plus the teachers."""
