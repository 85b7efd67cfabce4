"""``far.order_bias``: FAR's CLS map is ordered by the distance along the token sequence (papers/000, App. C).

The LSTM reads the tokens in sequence, CLS first, so App. C expects FAR's CLS attribution in the shallow layer to sit
"in the top-left region (neighboring tokens)", and the bias to give way to the teacher's layout by the deep layers.
This item measures, per block and image, how much of FAR's head-averaged CLS saliency follows 1 / (distance from
CLS along the sequence) and how much lies on the first patch row, against the teacher's saliency (the same
quantity) and attention; the verdict (:func:`~workbench.figures.far.findings_maps.order_bias_verdict`) reads the
blocks from the paper's intermediate depth on, where App. C says the maps have converged.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.figures import Finding, figure
from workbench.figures.far.items import MODELS, relative_layer
from workbench.figures.far.findings_maps import order_bias_verdict, order_r, top_row_share


def order_measures(maps: xr.Dataset) -> xr.Dataset:
    """Per (model, block, image): r with 1 / sequence distance and the first-row share; the last block's CLS map
    share per sequence position (mean over heads and images)."""
    layers = [int(v) for v in maps["layer"].values]
    r = [[order_r(maps, m, la) for la in layers] for m in MODELS]  # (model, layer, sample)
    top = [[top_row_share(maps, m, la) for la in layers] for m in MODELS]
    last = layers[-1]
    cls = np.abs(maps["cls_map"].sel(layer=last).transpose("model", "sample", "head", "y", "x").values.astype(float))
    cls = cls.reshape(*cls.shape[:3], -1)  # (model, sample, head, patches in sequence order)
    share = (cls / np.clip(cls.sum(-1, keepdims=True), 1e-30, None)).mean((1, 2))  # (model, patches)
    dims = ("model", "layer", "sample")
    return xr.Dataset({"order_r": (dims, np.array(r)), "top_row": (dims, np.array(top)),
                       "position_share": (("model", "position"), share)},
                      coords={"model": list(MODELS), "layer": layers, "sample": maps["sample"].values,
                              "position": np.arange(1, share.shape[1] + 1)},
                      attrs={"grid_x": maps.sizes["x"], "profile_block": last,
                             "first_block": relative_layer(maps, 5)})


def plot_order_bias(maps: xr.Dataset):
    from workbench.plots.far import plot_order_bias as draw

    n = maps.sizes["sample"]
    return draw(order_measures(maps), title=f"FAR's CLS map against the token order, per block ({n} images; bars: "
                                            "95 % interval over the images)")


figure("far.order_bias", paper="far", data="far.maps", plot=plot_order_bias,
       finding=Finding("FAR's CLS map is ordered by the distance along the token sequence beyond the shallow layer, "
                       "where App. C expects it: “since the CLS token appears at the beginning of the token sequence, it "
                       "can only incorporate information from future tokens in the forward pass, leading to initial "
                       "local activation” and “While early FAR layers reflect sequential bias, deeper layers exhibit "
                       "meaningful token-to-token alignment” (App. C)",
                       "App. C: the bias in layer 0 only, 'highly similar' maps by layer 7; tested from the paper's "
                       "intermediate depth on: r with 1 / sequence distance ≥ 0.5 and more mass on the first patch "
                       "row than the teacher's saliency, beyond noise",
                       order_bias_verdict(lambda maps: relative_layer(maps, 5))),
       caption="FAR's order bias (not a figure of the paper): left, the Pearson r of each model's head-averaged CLS map "
               "with 1 / (distance from CLS along the token sequence), per block; middle, the share of the CLS map on "
               "the first patch row (the tokens right after CLS), with the uniform share dashed; right, the last "
               "block's CLS map per sequence position (mean over heads and images). FAR saliency, the teacher's "
               "saliency (the same quantity) and the teacher's attention (dotted, the paper's reference); bars: 95 % "
               "Student t intervals over the analysis images. The LSTM reads the tokens in order, CLS first; where "
               "this bias dominates a block, FAR's CLS map piles onto the top patch rows, and on a digit whose top rows "
               "are blank it cannot follow the teacher's map, so far.fig5, fig10 and fig11 (which compare the layouts) "
               "cannot find the teacher's layout in such a block; far.fig9 tests the same bias in the shallow block, where the paper "
               "reports it.")
