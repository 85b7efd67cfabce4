"""vit-workbench: compress vision transformers and look inside the results."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``workbench.explore(...)`` (the explorer widget), imported on first use: ``import workbench`` stays light."""
    if name == "explore":
        import importlib

        return importlib.import_module("workbench.explore")  # a callable module: workbench.explore(...)
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
