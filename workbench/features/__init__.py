"""Model diffing with sparse crosscoders: what a student lost, kept and invented, latent by latent.

- :mod:`~workbench.features.crosscoder`: the BatchTopK crosscoder (per-model encoders and decoders, one latent space);
- :mod:`~workbench.features.pairs`: a teacher's and a student's activations at corresponding hook points, token by
  token on the same images, streamed in batches;
- :mod:`~workbench.features.train`: seeded, resumable training (safetensors checkpoints), on the GPU when present;
- :mod:`~workbench.features.diff`: per latent the relative decoder norm and class, dead / dense latents; per model
  the fraction of variance explained and L0 on held-out tokens, Latent Scaling on every exclusive latent, as an
  ``xr.Dataset`` with the ``latent`` dim;
- :mod:`~workbench.features.run`: ``workbench features`` (a teacher and a student in, the diff store out).
"""

from workbench.features.crosscoder import Crosscoder, CrosscoderConfig, load_crosscoder, save_crosscoder
from workbench.features.diff import LATENT_CLASSES, SCALING_VERDICTS, ClassThresholds, crosscoder_diff, latent_classes
from workbench.features.pairs import image_batches, paired_hooks, paired_tokens, token_rows
from workbench.features.train import crosscoder_loss, fit_crosscoder, train_crosscoder

__all__ = ["Crosscoder", "CrosscoderConfig", "load_crosscoder", "save_crosscoder", "LATENT_CLASSES", "SCALING_VERDICTS",
           "ClassThresholds", "crosscoder_diff", "latent_classes", "image_batches", "paired_hooks", "paired_tokens",
           "token_rows", "crosscoder_loss", "fit_crosscoder", "train_crosscoder"]
