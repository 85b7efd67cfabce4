"""Non-deep ViT: parallel branches joined progressively and collapsed into a shallow ViT.

Paper: "Non-deep Vision Transformers" (anonymous ICLR submission). A 12-block ViT becomes L/n
parallel blocks of n branches (LayerNorm before branching, blockwise attention, §3.2); during
training the branches' softmax and GELU inputs are joined by λ(t) (Eq. 4–9, App. B.2); at λ = 1
the model is reparameterised into an L/n-block ViT. The paper's merge formulas (Eq. 2, 6, 7) are
not exact; :func:`collapse` is, and keeps them as variants for comparison. Submodules:

- :mod:`.branched` — :class:`ParallelBlock`, :func:`branch` (teacher → branched form), hook points;
- :mod:`.baseline` — :func:`depth_baseline` (the teacher's first L/n blocks: Table 1's DeiT-l rows);
- :mod:`.schedules` — λ(t) (Eq. 10–13), :class:`ProgressiveJoin` (training hook), :func:`set_lambda`;
- :mod:`.collapse` — :func:`collapse` (exact / paper variants; concat, xwx, xwx_min, wide forms),
  :func:`collapse_errors`, :func:`collapse_exactness`;
- :mod:`.layernorm` — Eq. 1 (forward absorption, exact) and Eq. 2 (backward, not exact);
- :mod:`.losses` — diversity regulariser, attention-map distillation, :class:`NonDeepLoss`;
- :mod:`.similarity` — branch weight / feature similarity ``(block, module, branch_i, branch_j)``;
- :mod:`.flops` — params and MACs beside Table 1 (conventions stated there);
- :mod:`.measure` — single-thread latency and peak memory (Table 1, Tables 10 / 11);
- :mod:`.forms` — the timm names ``nondeep_branched`` and ``nondeep_collapsed``;
- :mod:`.config`, :mod:`.paper` — variants, hyperparameters, the paper's numbers.

Typical use::

    model = branch(teacher, branches=2)                     # or timm.create_model("nondeep_branched", ...)
    join = ProgressiveJoin("linear", warmup_steps=...).start(model)
    fit(model, train, val, cfg, loss_fn=NonDeepLoss(teacher, distill_weight=..., diversity_weight=0.05),
        hooks=[join])                                       # λ reaches 1 during training
    deploy = collapse(model)                                # a plain timm VisionTransformer, L/n blocks
    collapse_errors(model, images)                          # {"exact": ~1e-16, "paper": ~0.5}
"""

from . import forms  # noqa: F401  (registers nondeep_branched / nondeep_collapsed with timm)
from .baseline import depth_baseline
from .branched import (
    Branch,
    BranchAttention,
    BranchMlp,
    ParallelBlock,
    branch,
    check_branches,
    check_teacher,
    parallel_blocks,
    score_matrices,
    value_output_matrices,
)
from .collapse import (
    COLLAPSE_VARIANTS,
    FORMS,
    CollapseVariant,
    Form,
    MergeFormulas,
    XWXAttention,
    collapse,
    collapse_errors,
    collapse_exactness,
    collapsed_head_dim,
    max_relative_error,
    resolve_form,
)
from .config import DEMO_ABLATION, DEMO_JOIN, NONDEEP_VARIANTS, JoinConfig, NonDeepVariant
from .flops import CONVENTIONS, Cost, SizeRow, attention_matmul_macs, cost, paper_r_form_cost, table1
from .forms import nondeep_branched, nondeep_collapsed
from .layernorm import absorb_layernorm_backward, absorb_layernorm_forward
from .losses import (
    ATTN_OUT,
    FFN_OUT,
    PATTERN,
    NonDeepLoss,
    attention_distillation_loss,
    diversity_loss,
    pairwise_cos2,
    teacher_layers,
)
from .measure import PeakMemory, latencies, peak_memory
from .paper import PAPER_CPU_RATIOS, PAPER_MEMORY_GB, PAPER_TABLE1, PAPER_TABLE5, PAPER_TABLE6, Table1Row
from .schedules import (
    SCHEDULES,
    ProgressiveJoin,
    Schedule,
    check_schedule,
    get_lambda,
    lambda_curves,
    lambda_schedule,
    set_lambda,
)
from .similarity import (
    FEATURE_MODULES,
    WEIGHT_MODULES,
    branch_features,
    feature_similarity,
    update_similarity,
    weight_similarity,
)

__all__ = [
    "ATTN_OUT", "COLLAPSE_VARIANTS", "CONVENTIONS", "DEMO_ABLATION", "DEMO_JOIN", "FEATURE_MODULES", "FFN_OUT", "FORMS",
    "NONDEEP_VARIANTS", "PAPER_CPU_RATIOS", "PAPER_MEMORY_GB", "PAPER_TABLE1", "PAPER_TABLE5", "PAPER_TABLE6",
    "PATTERN",
    "SCHEDULES", "WEIGHT_MODULES",
    "Branch", "BranchAttention", "BranchMlp", "CollapseVariant", "Cost", "Form", "JoinConfig", "MergeFormulas", "XWXAttention",
    "NonDeepLoss", "NonDeepVariant", "ParallelBlock", "PeakMemory", "ProgressiveJoin", "Schedule", "SizeRow",
    "Table1Row",
    "absorb_layernorm_backward", "absorb_layernorm_forward", "attention_distillation_loss", "attention_matmul_macs",
    "branch", "branch_features", "check_branches", "check_schedule", "check_teacher", "collapse", "collapse_errors",
    "collapse_exactness", "collapsed_head_dim", "cost", "depth_baseline", "diversity_loss", "feature_similarity",
    "get_lambda",
    "lambda_curves", "lambda_schedule", "latencies", "max_relative_error", "nondeep_branched", "nondeep_collapsed",
    "pairwise_cos2", "paper_r_form_cost", "parallel_blocks", "peak_memory", "resolve_form", "score_matrices",
    "set_lambda",
    "table1", "teacher_layers", "update_similarity", "value_output_matrices", "weight_similarity",
]
