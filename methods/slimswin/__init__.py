"""SlimSwin: gradient-based window-level head pruning for Swin Transformers.

Eryilmaz & Akturk, "SlimSwin: Gradient-Based Window-Level Head Pruning for Efficient Vision
Transformers" (papers/004). Pure torch/timm; never imports ``workbench``.

* :mod:`.geometry` -- layers, windows, shifts; window index -> image position (§III-A).
* :mod:`.gates` -- window x head gates on Q/K/V (§IV-C) or head outputs (Michel et al. 2019).
* :mod:`.config` -- the hyper-parameters (§V-B).
* :mod:`.saliency` -- gate-gradient saliency and the KD loss (§IV-C, §V-B).
* :mod:`.prune` -- global ranking and Algorithm 1 (§IV-B, §IV-D).
* :mod:`.pruned` -- inference that skips pruned pairs (§IV-C, Fig. 3).
* :mod:`.forms` -- the train (gated) and deploy (pruned) forms as timm model names.
* :mod:`.flops` -- attention MACs under a mask (Table I) and a component-wise breakdown (Fig. 1).
"""

from .config import Exclude, SaliencyReduce, SlimSwinConfig
from .flops import (
                       PAPER_ATTENTION_MACS,
                       PAPER_RATIOS,
                       PAPER_TABLE_I,
                       PaperTableRow,
                       attention_macs,
                       sum_macs,
                       swin_flops_breakdown,
                       uniform_masks,
)
from .forms import slimswin_pruned, slimswin_swin
from .gates import GatedWindowAttention, GateMode, add_gates, gate_probes, gated_modules, get_masks, is_gated, set_mask
from .geometry import (
                       SWIN_BASE,
                       SWIN_DEMO,
                       SWIN_TINY,
                       SwinConfig,
                       SwinLayerGeometry,
                       WindowPosition,
                       check_swin,
                       swin_blocks,
                       swin_layers,
                       token_window_assignment,
                       window_centers,
                       window_positions,
)
from .prune import (
                       PruneHistory,
                       PruneStep,
                       global_ranking,
                       pairs_to_prune,
                       prunable_layers,
                       prune,
                       prune_step,
                       pruning_ratio,
)
from .pruned import PrunedWindowAttention, Rectangle, Strategy, pair_rectangles, rectangle_cost, to_pruned
from .saliency import kd_loss, window_head_saliency

__all__ = [
    # geometry
    "SwinConfig", "SWIN_TINY", "SWIN_BASE", "SWIN_DEMO", "SwinLayerGeometry", "WindowPosition", "check_swin",
    "swin_blocks", "swin_layers", "window_positions", "window_centers", "token_window_assignment",
    # gates
    "GateMode", "GatedWindowAttention", "add_gates", "is_gated", "gated_modules", "set_mask", "get_masks",
    "gate_probes",
    # saliency and Algorithm 1
    "SaliencyReduce", "Exclude", "SlimSwinConfig", "PruneStep", "PruneHistory", "kd_loss", "window_head_saliency",
    "prunable_layers", "pairs_to_prune", "pruning_ratio", "global_ranking", "prune_step", "prune",
    # model forms (timm names)
    "slimswin_swin", "slimswin_pruned",
    # pruned inference
    "Strategy", "Rectangle", "PrunedWindowAttention", "pair_rectangles", "rectangle_cost", "to_pruned",
    # MACs
    "attention_macs", "sum_macs", "swin_flops_breakdown", "uniform_masks", "PAPER_TABLE_I", "PAPER_ATTENTION_MACS",
    "PAPER_RATIOS", "PaperTableRow",
]
