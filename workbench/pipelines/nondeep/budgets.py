"""Budgets of the Non-deep ViT runs per profile (demo / smoke / paper), for :mod:`workbench.pipelines.nondeep.run`.

"Non-deep Vision Transformers" (anonymous ICLR submission, papers/002): the ``paper`` budget is §3.4 and
App. A.2 / B.1 (joining right after pre-training: a 10k-step Lambda Warmup Period, a 50k-step Post-Joining
Adjustment Phase, AdamW lr 1e-3, wd 0.05, batch 1024, α = 0.05); ``demo`` and ``smoke`` are ours. The
measured curves and one-core costs behind the demo numbers are in ``docs/nondeep-demo-budgets.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from methods.nondeep import DEMO_ABLATION, DEMO_JOIN, JoinConfig

#: α of the Table 5 rows "with the regulariser" on the demo and smoke profiles. The paper's α = 0.05 is inert at
#: the demo's 63-step ablation: measured on the 2×3 Table 5 student (demo teacher, 200 held-out digits) the trained
#: branches' L_div is 0.074 at α = 0 and 0.070 at α = 0.05 (one prediction of 200 changes), 0.019 at α = 5; at the
#: start of training α·∇L_div is 0.1 % of the CE + KD gradient on the branch weights at α = 0.05, 14 % at α = 5.
#: So the rows use α = 5, which the regulariser's own quantity shows to act (nondeep.fig6, nondeep.table5).
ABLATION_ALPHA = 5.0

__all__ = ["NonDeepBudget", "BUDGETS", "TABLE5_ROWS", "ABLATION_ALPHA"]

#: The rows of Table 5 run on the demo: (schedule, diversity regulariser on), as the paper's rows: no joining and
#: instant joining without the regulariser; every schedule of App. B.2 with it, and linear (the default) also
#: without (isolating α), and square-root (the fastest-rising schedule) with it. The paper has every schedule with and
#: without; the demo budget affords five rows (cosine and exponential: ``workbench run nondeep --table5 --schedule S``).
TABLE5_ROWS: tuple[tuple[str, bool], ...] = (
    ("none", False), ("instant", False), ("linear", True), ("linear", False), ("sqrt", True),
)


@dataclass(frozen=True)
class NonDeepBudget:
    """Budgets of one profile's Non-deep runs (the joining phase of §3.4, its ablation, the measurements)."""

    join: JoinConfig  # the students: schedule, λ warm-up / adjustment steps, α, KD, lr, weight decay, batch
    epochs: int | None = None  # training epochs; None: as many as warmup_steps + adjust_steps take
    warmup_epochs: int = 0  # learning-rate warm-up epochs (λ has its own warm-up, in steps)
    min_lr_ratio: float = 0.01  # floor of the cosine learning-rate schedule, as a fraction of the peak
    label_smoothing: float = 0.0  # of the cross-entropy (Table 9: 0)
    amp: bool = False  # bfloat16 autocast on CUDA
    cpu_threads: int | None = None  # torch threads on the CPU during training (None: torch's default)
    progress: bool = True  # progress bar
    eval_every: int = 1  # evaluate on the held-out set every N epochs and after the last (results read the last)
    seed: int = 0  # shuffling / augmentation seed
    students: tuple[int, ...] = (2, 3)  # branch counts n of the figures' students (demo teacher: 6 blocks)
    ablation: JoinConfig | None = None  # Table 5 rows' budget (None: the students' budget)
    ablation_branches: int = 3  # n of the Table 5 student
    ablation_train_images: int | None = None  # training images of each Table 5 row (class-balanced); None = all
    ablation_rows: tuple[tuple[str, bool], ...] = TABLE5_ROWS  # (schedule, diversity on) per row
    ablation_seeds: tuple[int, ...] = (0,)  # shuffling seeds of every Table 5 row (the first: the table's runs); the
    # verdict's interval spans them
    analysis_images: str = "demo:val"  # images of the similarity analyses (demo:val is sorted by class: take all)
    eval_images: str = "demo:val"  # images scoring the collapse variants' top-1 and float32 error (the held-out set)
    exact_images: str = "demo:val[:100]"  # images of the float64 collapse errors (costly on a CPU; exactness needs few)
    collapse_check_images: int = 64  # held-out images of each collapsed run's own float64 / float32 collapse check
    table1_branches: tuple[int, ...] = (2, 3, 4)  # real-size DeiT-Tiny compressions of Table 1 (6 / 4 / 3 blocks)
    real_img_size: int = 224  # input side of the real-size DeiT-Tiny models of Tables 1, 10, 11 (the paper's: 224)
    table1_repeats: int = 15  # latency: median of this many round-robin runs ...
    table1_warmup: int = 3  # ... after this many
    memory_batch: int = 16  # batch of the peak-memory measurements (paper: 256 on an H100)


#: profile -> budgets.
BUDGETS: dict[str, NonDeepBudget] = {
    # demo: the 6-block vit_demo teacher on MNIST-5k (4000 training images, 125 steps of 32 per epoch). Students:
    # 2 epochs, λ linear over the first (125 steps), logit distillation (T = 1) beside CE, α = 0.05, AdamW lr 5e-4
    # without lr warm-up (the teacher's blocks are the starting point), cosine to lr/100, one CPU thread (these
    # models are too small for a second thread to help). Table 5: one epoch of 2000 images per row (λ over the first
    # half). Held-out evaluation after a run's last epoch only (nothing reads the others; the weights do not change).
    # Measured costs and accuracies: docs/nondeep-demo-budgets.md.
    "demo": NonDeepBudget(join=DEMO_JOIN, cpu_threads=1, eval_every=1000, ablation=replace(DEMO_ABLATION, diversity_weight=ABLATION_ALPHA),
                          ablation_train_images=2000, ablation_seeds=(0, 1, 2),  # ~10 s a row: +2 × 5 rows
                          analysis_images="demo:val",
                          table1_repeats=11, table1_warmup=3, memory_batch=16),
    # smoke: a handful of updates, only to exercise the pipeline (128 training images: 8 steps of 16 per epoch);
    # the four Table 5 rows the notes compare, real-size models at 32² (only the code path matters).
    "smoke": NonDeepBudget(
        join=JoinConfig(warmup_steps=4, adjust_steps=4, kd_weight=1.0, lr=5e-4, batch_size=16), cpu_threads=1,
        progress=False, ablation=JoinConfig(warmup_steps=2, adjust_steps=2, kd_weight=1.0, lr=5e-4, batch_size=32,
                            diversity_weight=ABLATION_ALPHA),
        ablation_rows=(("none", False), ("instant", False), ("linear", True), ("linear", False)), ablation_seeds=(0, 1),
        analysis_images="demo:val[:4]", eval_images="demo:val[:32]", exact_images="demo:val[:4]", collapse_check_images=8,
        table1_branches=(2,), table1_repeats=1, table1_warmup=0, memory_batch=1, real_img_size=32,
    ),
    # paper: App. A.2 / B.1 with the defaults of methods.nondeep.JoinConfig (10k + 50k steps, lr 1e-3, wd 0.05, batch
    # 1024, α = 0.05, linear λ with rectification), 5 lr warm-up epochs (Table 9), AMP. Not implemented: Table 9's
    # layer-wise lr decay 0.85, RandAug, mixup and the MAE-Base attention-map teacher (the paper's D-MAE models
    # distil attention from it; here the branched model's own teacher is the only one, distill_weight stays 0).
    "paper": NonDeepBudget(join=JoinConfig(), warmup_epochs=5, min_lr_ratio=1e-3, amp=True, progress=True,
                           analysis_images="skimage:astronaut,chelsea,coffee",
                           eval_images="skimage:astronaut,chelsea,coffee",
                           exact_images="skimage:astronaut,chelsea,coffee", memory_batch=256),
}
