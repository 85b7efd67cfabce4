"""vit-workbench: compress vision transformers and look inside the results."""

__version__ = "0.1.0"
