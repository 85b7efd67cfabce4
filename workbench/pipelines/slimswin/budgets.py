"""Budgets of the SlimSwin runs per profile (demo / smoke / paper), for :mod:`workbench.pipelines.slimswin.run`.

Eryilmaz & Akturk, "SlimSwin: Gradient-Based Window-Level Head Pruning" (papers/004): the ``paper`` budget is
§V-B; ``demo`` and ``smoke`` are ours, chosen from the measurements in ``docs/budgets.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from methods.slimswin import PAPER_RATIOS, SlimSwinConfig

__all__ = ["SlimSwinRecipe", "RECIPES"]


@dataclass(frozen=True)
class SlimSwinRecipe:
    """Budgets of one profile: the method's hyper-parameters plus what the pipeline adds."""

    method: SlimSwinConfig  # SlimSwin hyper-parameters (its target_ratio is replaced per run)
    batch_size: int = 64  # training batch size of every fine-tune (paper: not stated)
    saliency_batch: int = 128  # images per saliency forward/backward (memory only; result unchanged)
    ratios: tuple[float, ...] = PAPER_RATIOS  # global ratios of the sweep behind the figures (paper §VI: 1/3 ... 2/3)
    seed: int = 0  # seeds the per-iteration subsets and the fine-tunes
    saliency_images: str = "demo:val[:256]"  # image spec of the saliency-before-pruning figure (fig3)
    progress: bool = True  # progress bar during the final fine-tune
    eval_iterations: bool = True  # held-out accuracy after every iteration (recorded in history.json)
    cpu_threads: int | None = None  # torch CPU threads during the run (None: torch's default; see RECIPES)
    final_train_images: int | None = None  # images of the final fine-tune (class-balanced); None: the whole set (Alg. 1)
    baseline_ratios: tuple[float, ...] = ()  # ratios with fine-tuned random / uniform-per-layer baselines (slimswin_baselines)
    baseline_seeds: tuple[int, ...] = (0, 1, 2)  # mask draws averaged in the no-fine-tune baseline comparison
    run_seeds: tuple[int, ...] = (0,)  # training seeds (``seed`` of a run) of SlimSwin and its fine-tuned baselines at
    # baseline_ratios, whose differences Fig. 4's verdict tests (the first: the sweep's and baselines' runs)


#: profile -> recipe. ``paper`` is §V-B: AdamW 5e-5, wd 1e-4, KD alpha 0.7 / T 2, 15 final epochs with
#: a cosine schedule and 10 % warm-up from 1e-6; pairs per iteration, subset sizes and batch size are
#: not stated in the paper (ours: SlimSwinConfig defaults, i = 32, batch 128). Ratios: the paper's
#: 1/3, 4/9, 5/9, 2/3 (printed 0.33 ... 0.67; methods.slimswin.PAPER_RATIOS).
RECIPES: dict[str, SlimSwinRecipe] = {
    # demo Swin (swin_demo), 144 prunable pairs; i = 8 reaches the paper's ratios exactly. The per-iteration fine-tune
    # takes the method's default 10 % of the training set (400 images; it was 25 %: the cold budget, the iterations
    # half as long, the same held-out top-1 within the noise). Measurements: docs/budgets.md.
    "demo": SlimSwinRecipe(
        SlimSwinConfig(step_pairs=8, saliency_samples=256, finetune_fraction=0.1, final_epochs=1, lr=1e-3),
        batch_size=64, ratios=PAPER_RATIOS, saliency_images="demo:val[:256]", cpu_threads=1, final_train_images=1000,
        eval_iterations=False,  # no figure reads the per-iteration accuracy; the one after the last iteration is kept
        baseline_ratios=(PAPER_RATIOS[-1],),  # the fine-tuned baselines where pruning costs most (docs/budgets.md)
        run_seeds=(0, 1, 2),
    ),
    "smoke": SlimSwinRecipe(
        SlimSwinConfig(step_pairs=16, saliency_samples=32, finetune_fraction=0.25, final_epochs=1, lr=1e-3),
        batch_size=64, ratios=(PAPER_RATIOS[0], PAPER_RATIOS[-1]), saliency_images="demo:val[:16]", progress=False,
        eval_iterations=False, cpu_threads=1, baseline_ratios=(PAPER_RATIOS[-1],), baseline_seeds=(0, 1),
        run_seeds=(0,),  # one seed: the suite's time (the seed path is tested with Non-deep's two)
    ),
    "paper": SlimSwinRecipe(SlimSwinConfig(), batch_size=128, ratios=PAPER_RATIOS,
                            saliency_images="skimage:astronaut,chelsea,coffee"),
}
