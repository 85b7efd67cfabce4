"""Sparsifiner: learned instance-dependent sparse attention (Wei, Duke, Jiang, Aarabi, Taylor,
Shkurti — "Sparsifiner: Learning Sparse Instance-Dependent Attention for Efficient Vision
Transformers", CVPR 2023).

Every attention of a pretrained timm ViT gains a connectivity mask predictor — a low-rank
attention over keys down-projected to n_down tokens (Eq. 1), thresholded (Eq. 2) and up-projected
through a sparse basis W_up, whose top-B entries per query row form the mask (Eq. 3) — and
attends only where the mask is on (Eq. 4–6). Training has two phases (§3.3, §4): the predictor
alone distils the teacher's attention (Eq. 10), then backbone and predictor train with CE, token
and logit distillation (Eq. 7–9). Submodules:

- :mod:`.attention` — :class:`SparsifinerAttention` (masked train form, sparse deploy path),
  :class:`ConnectivityPredictor`, :class:`LinformerAttention` (Table 4 baseline); hook points;
- :mod:`.replace` — :func:`replace_attention`, :func:`replace_with_linformer`, form conversions
  (:func:`to_sparse_path`, :func:`to_masked`), phase set-up (:func:`freeze_for_phase1`, :func:`dense_attention`);
- :mod:`.forms` — the timm-registered forms ``sparsifiner_vit``, ``sparsifiner_vit_sparse``, ``linformer_vit``;
- :mod:`.losses` — :class:`Phase1Loss`, :class:`Phase2Loss` (``methods.train.fit`` loss functions);
- :mod:`.flops` — the MHSA MAC accountant in the paper's convention, our count beside Tables 1–3;
- :mod:`.introspect` — masks, sparse / full attention, coefficients, the basis on the patch grid, sparsity;
- :mod:`.config` — :class:`SparsifinerConfig` (paper defaults, the authors' code as options), phase
  configs and :data:`SPARSIFINER_VARIANTS`; :mod:`.paper` — the paper's numbers.

Typical use::

    student = replace_attention(teacher, SparsifinerConfig(keep_rate=0.25, n_down=8))
    fit(freeze_for_phase1(student), train, val, cfg1, loss_fn=Phase1Loss())          # phase 1
    fit(unfreeze_all(student), train, val, cfg2, loss_fn=Phase2Loss(teacher))         # phase 2
    deploy = to_sparse_path(student.eval())                                            # same outputs, kept pairs only
    logits, cache = run_with_cache(deploy, images, names="blocks.*.attn.hook_mask")
"""

from .attention import (
    ConnectivityPredictor,
    LinformerAttention,
    SparsifinerAttention,
    connectivity_indices,
    kept_connections,
    mask_from_indices,
)
from .config import (
    DEMO_PHASES,
    SPARSIFINER_VARIANTS,
    BasisSign,
    KLDirection,
    Phase1Config,
    Phase2Config,
    Recon,
    Scale,
    SparsifinerConfig,
    SparsifinerVariant,
    budget,
)
from .flops import (
    PAPER_UP_DENSITY,
    STATED_UP_DENSITY,
    dense_mhsa_macs,
    executed_mhsa_macs,
    linformer_mhsa_macs,
    sparsifiner_mhsa_macs,
    table,
)
from .forms import FORMS, form_kwargs, linformer_vit, sparsifiner_vit, sparsifiner_vit_sparse
from .introspect import basis_grid, connectivity, grid_shape, sparse_basis, sparsity
from .losses import Phase1Loss, Phase2Loss, attention_distillation, basis_l2, recon_hook_names, teacher_attention
from .paper import PAPER_TABLE1_LVVIT, PAPER_TABLE2, PAPER_TABLE3, PAPER_TABLE3_OVERALL_GFLOPS, PAPER_TABLE4
from .replace import (
    check_vit,
    dense_attention,
    freeze_for_phase1,
    linformer_attentions,
    num_tokens,
    predictor_parameters,
    replace_attention,
    replace_with_linformer,
    sparse_attentions,
    to_masked,
    to_sparse_path,
    unfreeze_all,
)

__all__ = [
    "DEMO_PHASES", "FORMS", "PAPER_TABLE1_LVVIT", "PAPER_TABLE2", "PAPER_TABLE3", "PAPER_TABLE3_OVERALL_GFLOPS", "PAPER_TABLE4",
    "PAPER_UP_DENSITY", "SPARSIFINER_VARIANTS", "STATED_UP_DENSITY",
    "BasisSign", "ConnectivityPredictor", "KLDirection", "LinformerAttention", "Phase1Config", "Phase1Loss",
    "Phase2Config", "Phase2Loss", "Recon", "Scale", "SparsifinerAttention", "SparsifinerConfig", "SparsifinerVariant",
    "attention_distillation", "basis_grid", "basis_l2", "budget", "check_vit", "connectivity", "connectivity_indices", "kept_connections",
    "dense_attention", "dense_mhsa_macs", "executed_mhsa_macs", "form_kwargs", "freeze_for_phase1", "grid_shape",
    "linformer_attentions", "linformer_mhsa_macs", "linformer_vit", "mask_from_indices", "num_tokens",
    "predictor_parameters", "recon_hook_names", "replace_attention", "replace_with_linformer", "sparse_attentions",
    "sparse_basis", "sparsifiner_mhsa_macs", "sparsifiner_vit", "sparsifiner_vit_sparse", "sparsity", "table",
    "teacher_attention", "to_masked", "to_sparse_path", "unfreeze_all",
]
