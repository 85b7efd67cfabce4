"""FAR: Function-preserving Attention Replacement (Ren, Collins, Hu, Yang — "Is Attention Required
for Transformer Inference? Explore Function-preserving Attention Replacement").

Every attention block of a pretrained timm ViT is replaced by a multi-head bidirectional LSTM
(§3.2, Fig. 2), distilled block-wise with a cosine similarity loss plus cross-entropy (§3.1,
Eq. 3–4), then pruned along the LSTM hidden units with a group DeepHoyer regulariser (§3.3,
Eq. 5–6). Submodules:

- :mod:`.lstm` — :class:`MultiHeadBiLSTM`, the substitute;
- :mod:`.replace` — :func:`replace_attention`, freezing, :func:`block_outputs`;
- :mod:`.losses` — :func:`similarity_loss`, :class:`FARLoss` (Table 3 schedules);
- :mod:`.hoyer` — group norms, Hoyer regulariser, masks, :func:`shrink`;
- :mod:`.flops` — params / MACs per component and the paper's Table 2;
- :mod:`.config` — size variants and the hyperparameters of App. A;
- :mod:`.adjoint` — the BiLSTM's input gradients for all output tokens at once (token dependency, §4.3);
- :mod:`.latency` — single-image CPU latency in PyTorch / ONNX Runtime (App. A.4), uniform pruning masks;
- :mod:`.paper` — the paper's Table 1 and Table 3 numbers;
- :mod:`.forms` — the model forms as timm names (``far_vit``, with ``keep`` masks for the shrunk form).

Typical use::

    student = freeze_for_distillation(replace_attention(teacher))
    loss_fn = FARLoss(teacher, schedule="combined", lam=1.0)       # (student, x, y) -> (loss, parts)
    ...                                                              # distill, then unfreeze_all
    reg_loss = FARLoss(None, "cls", hoyer_weight=1e-4)              # DeepHoyer regularised training
    masks = prune_masks(student, threshold=1e-4)
    hook = mask_hook(masks)                                         # after every optimizer step
    small = shrink(student, masks)                                  # physically pruned, same function
"""

from .adjoint import bilstm_head_adjoint, lstm_sum_adjoint
from .config import (
    FAR_VARIANTS,
    FARConfig,
    FARVariant,
    Grouping,
    Schedule,
    SimInput,
)
from .flops import (
    CONVENTIONS,
    PAPER_TABLE2,
    Table2Row,
    attention_macs,
    count_flops,
    count_params,
    lstm_macs,
    substitute_macs,
    table2,
)
from .forms import far_config, far_vit
from .hoyer import (
    apply_masks,
    group_hoyer,
    hoyer_regularizer,
    kept_masks,
    load_pruned_state_dict,
    mask_hook,
    prune_masks,
    retention,
    shrink,
    unit_group_norms,
)
from .latency import onnx_latency_ms, torch_latencies_ms, torch_latency_ms, torch_latency_runs_ms, uniform_keep_masks
from .losses import SCHEDULES, FARLoss, similarity_loss
from .lstm import DIRECTIONS, MultiHeadBiLSTM
from .paper import PAPER_TABLE1_IMAGENET, PAPER_TABLE3, PAPER_UNIFORM_KEEP
from .replace import (
    block_outputs,
    capture_block_outputs,
    check_vit,
    embed_tokens,
    freeze_for_distillation,
    from_scratch,
    replace_attention,
    substitutes,
    unfreeze_all,
)

__all__ = [
    "CONVENTIONS", "DIRECTIONS", "FAR_VARIANTS", "PAPER_TABLE1_IMAGENET", "PAPER_TABLE2", "PAPER_TABLE3",
    "PAPER_UNIFORM_KEEP", "SCHEDULES", "onnx_latency_ms", "torch_latencies_ms", "torch_latency_ms", "torch_latency_runs_ms",
    "uniform_keep_masks",
    "FARConfig", "FARLoss", "FARVariant", "Grouping", "MultiHeadBiLSTM",
    "Schedule", "SimInput", "Table2Row",
    "apply_masks", "far_config", "far_vit", "attention_macs", "bilstm_head_adjoint", "block_outputs", "capture_block_outputs", "check_vit", "count_flops",
    "count_params", "embed_tokens", "freeze_for_distillation", "from_scratch", "group_hoyer",
    "hoyer_regularizer", "kept_masks", "load_pruned_state_dict", "lstm_macs", "lstm_sum_adjoint", "mask_hook", "prune_masks",
    "replace_attention", "retention", "shrink", "similarity_loss", "substitute_macs", "substitutes",
    "table2", "unfreeze_all", "unit_group_norms",
]
