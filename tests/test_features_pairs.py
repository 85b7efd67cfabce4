"""workbench.features.pairs: the rows paired across a teacher and a student are the same image positions.

Swin / SlimSwin blocks attend within (shifted) windows, but their block outputs are ``(B, H, W, C)`` maps in image
order (timm reverses the window partition and the shift), and CNN / AttentionLite stages are ``(B, C, H, W)`` maps:
the pairing reads both as positions. Independent check: a change of one small patch of pixels must change most the
row at that position (the residual carries it), in both models, at every paired stage of equal resolution — at
positions chosen off the diagonal, so a transposed or window-ordered layout would fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import timm
import torch

from methods.hooks import run_with_cache
from workbench.features import paired_hooks
from workbench.features.pairs import token_rows


def _pair(kind: str):
    from workbench.models import create_model

    torch.manual_seed(0)
    if kind == "swin":
        import methods.slimswin as ss

        teacher = create_model("swin_demo").eval()
        student = ss.add_gates(create_model("swin_demo")).eval()
        masks = [torch.rand(m.shape, generator=torch.Generator().manual_seed(i)) > 0.4
                 for i, m in enumerate(ss.get_masks(student))]
        ss.set_mask(student, masks)  # a pruned SlimSwin: other activations, the same positions
        return teacher, student
    return timm.create_model("cnn_demo").eval(), timm.create_model("sa_resnet_demo").eval()


def _changed(model, hook: str, x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, tuple[int, int]]:
    """Per row the norm of the change of ``model``'s rows at ``hook`` between images ``x`` and ``y`` (one each), and
    the hook's grid."""
    _, a = run_with_cache(model, x, names=[hook])
    _, b = run_with_cache(model, y, names=[hook])
    shape = a[hook].shape
    grid = tuple(shape[2:4]) if hook.endswith(".hook_out") else tuple(shape[1:3])
    return (token_rows(a[hook], hook) - token_rows(b[hook], hook)).norm(dim=1).numpy(), grid


@pytest.mark.parametrize("kind", ["swin", "cnn"])
def test_paired_rows_are_the_same_image_positions(kind):
    teacher, student = _pair(kind)
    size = 32 if kind == "swin" else 28
    x = torch.randn(1, 1, size, size, generator=torch.Generator().manual_seed(1))
    pairs = paired_hooks(teacher, student)
    checked = 0
    for t_hook, s_hook in pairs.items():
        for fy, fx in ((0.1, 0.7), (0.8, 0.3)):  # (row, column) as fractions of the image
            py, px = int(fy * size), int(fx * size)
            y = x.clone()
            y[..., py:py + 2, px:px + 2] += 3.0  # a 2 x 2 pixel change inside one patch / cell
            dt, grid = _changed(teacher, t_hook, x, y)
            ds, s_grid = _changed(student, s_hook, x, y)
            if grid != s_grid or grid[0] < 7:  # unequal grids: refused by paired_tokens; on tiny grids every cell sees it all
                continue
            where = (int((py + 1) * grid[0] / size), int((px + 1) * grid[1] / size))  # the changed pixels' cell
            reach = max(1, int(np.ceil(3 * grid[0] / size)))  # a conv's 3-pixel reach, in cells (1 on coarse grids)
            for name, d in (("teacher", dt), ("student", ds)):
                top = np.unravel_index(int(d.argmax()), grid)  # row index -> (row, column), row-major
                assert max(abs(top[0] - where[0]), abs(top[1] - where[1])) <= reach, (kind, t_hook, name, top, where)
            checked += 1
    assert checked >= 4, checked  # both positions at two or more paired stages
