"""AttentionLite: sparse distillation of a CNN teacher into self-attention ResNets (Kundu & Sundaresan,
"AttentionLite: Towards Efficient Self-Attention Models for Vision", papers/003).

A ResNet50-style CNN teacher is distilled, with logits (KD) and spatial attention maps (AT), into
an SA-ResNet student whose k × k convolutions are local self-attention (Eq. 1), while the student is
pruned from the first step by sparse momentum at a fixed parameter density (Eq. 2, Algorithm 1).
Pure torch + timm; never imports ``workbench``. Submodules:

- :mod:`.attention` — :class:`LocalSelfAttention` (Eq. 1) on two counted neighbourhood operators;
  column-pruned layers :class:`ColumnConv2d`, :class:`ColumnLinear`; the naive unfold reference;
- :mod:`.resnet` — :class:`SABottleneck` and the timm-registered students ``sa_resnet26``,
  ``sa_resnet38``, ``sa_resnet_demo``, ``sa_resnet`` (hybrid ``stem="conv"`` / homogeneous ``"attention"``);
- :mod:`.losses` — :func:`at_map`, :func:`at_loss`, :func:`kd_loss`, :class:`SparseDistillationLoss` (Eq. 2);
- :mod:`.sparse` — :class:`SparseMomentum`, a ``methods.train.TrainHook`` (Algorithm 1), irregular / column;
- :mod:`.shrink` — :func:`shrink` (column pruning's deploy form, timm ``sa_resnet_column``), :func:`deploy_kwargs`;
- :mod:`.introspect` — densities, parameter and MAC counts, AT maps per stage, attention for a query pixel;
- :mod:`.config` — :data:`SA_VARIANTS`, :class:`DistillConfig`, :class:`SparseConfig`;
- :mod:`.paper` — Tables 1 and 2, :func:`reductions` at paper size.

Typical use::

    student = timm.create_model("sa_resnet_demo")                       # or SA_VARIANTS["demo"].build()
    loss_fn = SparseDistillationLoss(teacher, alpha=0.1, beta=1000, rho=4, student=student)
    sparse = SparseMomentum(student, density=0.5, pruning="column", epochs=cfg.epochs)
    fit(student, train, val, cfg, loss_fn=loss_fn, hooks=[sparse])      # methods.train
    deploy = shrink(student, sparse.weight_masks())                     # == the masked student
    kw = deploy_kwargs(sparse.weight_masks(), "sa_resnet_demo")         # timm.create_model("sa_resnet_column", **kw)
"""

from .attention import (
                        ColumnConv2d,
                        ColumnLinear,
                        LocalSelfAttention,
                        local_attention_unfold,
                        neighbour_dot,
                        neighbour_mask,
                        neighbour_mix,
)
from .config import (
                        DEMO_RECIPE,
                        PAPER_DENSITIES,
                        SA_VARIANTS,
                        DemoRecipe,
                        DistillConfig,
                        SAVariant,
                        SparseConfig,
                        VariantName,
)
from .introspect import count_macs_sparse, count_params, layer_densities, query_attention, stage_at_maps
from .losses import ATForm, Resize, SparseDistillationLoss, at_loss, at_map, kd_loss, stage_names
from .paper import PAPER_TABLE1, PAPER_TABLE2, PaperRow, Reduction, cifar_resnet50, reductions, resnet50_cifar
from .resnet import (
                        SABottleneck,
                        Stem,
                        attention_layers,
                        build_sa_resnet,
                        sa_resnet,
                        sa_resnet26,
                        sa_resnet38,
                        sa_resnet_demo,
)
from .shrink import deploy_kwargs, kept_columns, sa_resnet_column, shrink
from .sparse import (
                        PRUNINGS,
                        Decay,
                        Pruning,
                        SparseMomentum,
                        UpdateAt,
                        check_density,
                        check_pruning,
                        column_masks_from_weights,
                        prunable_layers,
                        prune_rate,
                        weight_masks_density,
)

__all__ = [
    "ATForm", "DEMO_RECIPE", "DemoRecipe",
    "ColumnConv2d", "ColumnLinear", "Decay", "DistillConfig", "LocalSelfAttention", "PAPER_DENSITIES",
    "PAPER_TABLE1", "PAPER_TABLE2", "PRUNINGS", "PaperRow", "Pruning", "Reduction", "Resize", "SABottleneck",
    "SAVariant", "SA_VARIANTS", "SparseConfig", "SparseDistillationLoss", "SparseMomentum", "Stem", "UpdateAt", "VariantName",
    "at_loss", "at_map", "attention_layers", "build_sa_resnet", "check_density", "check_pruning", "cifar_resnet50",
    "column_masks_from_weights", "count_macs_sparse", "count_params", "deploy_kwargs", "kd_loss", "kept_columns",
    "layer_densities", "local_attention_unfold", "neighbour_dot", "neighbour_mask", "neighbour_mix",
    "prunable_layers", "prune_rate", "query_attention", "reductions", "resnet50_cifar", "sa_resnet", "sa_resnet26", "sa_resnet38",
    "sa_resnet_column", "sa_resnet_demo", "shrink", "stage_at_maps", "stage_names", "weight_masks_density",
]
