"""CUDA safety checked on the CPU: what would fail the first time the code meets a GPU.

- **No ``.numpy()`` on a tensor that may live on a GPU** (an AST scan of ``workbench/`` and ``methods/``): every
  ``.numpy()`` call must have ``.cpu()`` earlier in the same expression chain (``x.detach().cpu().numpy()``), or go
  through :func:`methods.devices.to_numpy`; the few proven-CPU exceptions are listed in :data:`CPU_ONLY` with the
  reason.
- **Every backward through an LSTM runs where cuDNN accepts it**: cuDNN refuses an RNN backward outside training
  mode, so each ``nn.LSTM`` forward that records a graph must happen in training mode or with cuDNN off
  (:func:`methods.devices.differentiable`). ``nn.LSTM.forward`` is wrapped to record the mode and the flag at every
  such call, and the analyses that differentiate a FAR model (Integrated Gradients, Saliency, the four token
  dependency forms, the whole ``compare`` analysis) are run through it.
- **A distillation loss computes on one device**: FAR's ``FARLoss`` and Sparsifiner's ``Phase2Loss``, built from the
  budget as the pipelines build them, run forward and backward under a dispatch mode that records the devices of
  every op's tensor inputs. The CPU stands in for two GPUs with the ``meta`` device: a teacher left on one device
  and a student on another fail (as ``cuda:0`` / ``cuda:1`` did under ``torchrun``); both on the student's device
  run with every op on that one device (nothing made on a default device by the loss).
- **CUDA only** (skipped without a GPU): a FAR training step under the paper budget's autocast gives a finite loss
  and finite gradients, with its LSTMs in float16 and a gradient scaler (``methods.train.grad_scaler``); the
  eval-mode attributions of a FAR model run on the GPU; AttentionLite's column shrink passes its 1e-4 check there.
"""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from methods.devices import differentiable, exact_float32, has_rnn

ROOT = Path(__file__).resolve().parents[1]

#: (file, enclosing function) -> why the tensor there is on the CPU by construction.
CPU_ONLY: dict[tuple[str, str], str] = {
    ("workbench/analysis/retention.py", "extract_retention"): "norms, kept and hoyer come from `…float().cpu()`",
    ("workbench/analysis/token_maps.py", "_js"): "the tensors are made from NumPy arrays (torch.as_tensor)",
    ("workbench/analysis/window_saliency.py", "extract_window_saliency"): "every gradient is moved `.cpu()` first",
    ("workbench/pipelines/heldout.py", "correctness"): "every batch's correctness is moved `.cpu()` first",
    ("workbench/pipelines/sparsifiner/baselines.py", "correctness"): "every batch's correctness is moved `.cpu()` first",
    ("workbench/pipelines/nondeep/measures.py", "weight_update_similarity"): "load_joined / load_branched load on the CPU",
}


def _chain_has_cpu(node: ast.expr) -> bool:
    """Whether the receiver chain of a call (``a.b().cpu().c()``) holds ``.cpu()`` or ``.to("cpu")``."""
    while True:
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "cpu":
                return True
            if (isinstance(f, ast.Attribute) and f.attr == "to" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == "cpu"):
                return True
            node = f
        elif isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return False


def numpy_calls(path: Path, root: Path = ROOT) -> list[tuple[str, str, int, str]]:
    """``(file, function, line, source)`` of every ``.numpy()`` call without ``.cpu()`` before it in its chain."""
    text = path.read_text()
    tree = ast.parse(text)
    out = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "numpy"
                    and not child.args and not _chain_has_cpu(child.func.value)):
                out.append((path.relative_to(root).as_posix(), func, child.lineno, ast.get_source_segment(text, child)))
            visit(child, name)

    visit(tree, "<module>")
    return out


def _unsafe_numpy(root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted([*root.glob("methods/**/*.py"), *root.glob("workbench/**/*.py")]):
        for file, func, line, src in numpy_calls(path, root):
            if (file, func) not in CPU_ONLY:
                found.append(f"{file}:{line} in {func}: {src}")
    return found


def test_no_numpy_on_tensors_that_may_live_on_a_gpu():
    found = _unsafe_numpy()
    assert not found, ("`.numpy()` on a tensor that may be on a GPU (raises there): write `.cpu().numpy()` or "
                       "methods.devices.to_numpy, or list a proven-CPU case in CPU_ONLY:\n" + "\n".join(found))


def test_the_numpy_lint_catches_what_it_should(tmp_path):
    src = tmp_path / "workbench" / "m.py"
    src.parent.mkdir()
    src.write_text("def f(x, y, z):\n"
                   "    a = x.numpy()\n"  # caught
                   "    b = y.detach().cpu().numpy()\n"  # fine
                   "    c = (z * 2).sum(0).numpy()\n"  # caught
                   "    d = z.to('cpu')[0].numpy()\n"  # fine
                   "    e = z.cpu().double().numpy()\n"  # fine
                   "    return a, b, c, d, e\n")
    assert [(f, fn, line) for f, fn, line, _ in numpy_calls(src, tmp_path)] == [("workbench/m.py", "f", 2),
                                                                                 ("workbench/m.py", "f", 4)]
    assert not [k for k in CPU_ONLY if not (ROOT / k[0]).exists()], "an allow-list entry names a file that is gone"


# ------------------------------------------------------------------------------------- LSTM backward
TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)


@pytest.fixture
def lstm_calls(monkeypatch):
    """Every ``nn.LSTM`` forward that records a graph: ``(training, cudnn enabled)``."""
    calls: list[tuple[bool, bool]] = []
    forward = nn.LSTM.forward

    def recording(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if torch.is_grad_enabled() and out[0].requires_grad:
            calls.append((self.training, torch.backends.cudnn.enabled))
        return out

    monkeypatch.setattr(nn.LSTM, "forward", recording)
    return calls


@pytest.fixture(scope="module")
def far_pair():
    from methods.far import replace_attention

    torch.manual_seed(0)
    teacher = VisionTransformer(**TINY).eval()
    return teacher, replace_attention(teacher).eval()


def _refused(calls: list[tuple[bool, bool]]) -> list[tuple[bool, bool]]:
    return [c for c in calls if not c[0] and c[1]]  # eval mode with cuDNN on: cuDNN's backward raises


def test_the_lstm_check_sees_an_eval_mode_backward_with_cudnn(far_pair, lstm_calls):
    _, far = far_pair
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    far(x)[:, 0].sum().backward()  # what captum did before: eval mode, cuDNN on
    assert lstm_calls and _refused(lstm_calls) == lstm_calls
    lstm_calls.clear()
    with differentiable(far):
        far(x)[:, 0].sum().backward()
    assert lstm_calls and not _refused(lstm_calls)
    assert torch.backends.cudnn.enabled, "differentiable left cuDNN off"


def test_differentiable_keeps_cudnn_for_models_without_rnns(far_pair):
    teacher, far = far_pair
    assert not has_rnn(teacher) and has_rnn(far) and has_rnn(lambda x: x) and has_rnn()
    with differentiable(teacher):
        assert torch.backends.cudnn.enabled
    with differentiable(teacher, far):
        assert not torch.backends.cudnn.enabled
    with exact_float32():
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cudnn.allow_tf32, "exact_float32 did not restore the flag"


def test_attributions_and_dependency_differentiate_lstms_where_cudnn_accepts(far_pair, lstm_calls):
    from workbench.analysis.attribution import integrated_gradients, saliency
    from workbench.analysis.dependency import (
        block_inputs,
        dependency,
        dependency_captum,
        dependency_factored,
        dependency_loop,
        head_output_fn,
        model_dependency,
    )

    _, far = far_pair
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    target = torch.tensor([0, 3])
    integrated_gradients(far, x, target, n_steps=4)
    saliency(far, x, target)
    model_dependency(far, x, layers=[0], queries=[0], method="loop")
    (inp,) = block_inputs(far, x, [1], wrt="lstm_input")
    fn = head_output_fn(far.blocks[1], "lstm_input")
    for form in (dependency, dependency_loop, dependency_captum, dependency_factored):
        form(fn, inp, [0, 5])
    assert len(lstm_calls) > 10 and not _refused(lstm_calls), f"{len(_refused(lstm_calls))} LSTM forwards with a graph in eval mode with cuDNN on"


def test_the_compare_analysis_differentiates_lstms_where_cudnn_accepts(far_pair, lstm_calls):
    from workbench.analysis.teacher_vs_students import compare_models

    teacher, far = far_pair
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    compare_models(teacher, {"far": far}, x, labels=[0, 1, 2, 3], ig_steps=4, steps=4, parts=("attributions",))
    assert lstm_calls and not _refused(lstm_calls)


# ------------------------------------------------------------------------------------- one device per loss
class OneDevice(TorchDispatchMode):
    """Records every op whose tensor inputs live on more than one device (0-dim CPU scalars aside, as CUDA allows)."""

    def __init__(self):
        super().__init__()
        self.mixed: list[tuple[str, list[str]]] = []
        self.devices: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        flat, _ = tree_flatten((args, kwargs or {}))
        devs = {str(t.device) for t in flat if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)}
        self.devices |= devs
        if len(devs) > 1:
            self.mixed.append((str(func), sorted(devs)))
        return func(*args, **(kwargs or {}))


def _far_loss(teacher_device: str, device: str):
    """FAR's distillation objective as workbench.pipelines.far.run builds it (the demo budget): the student copied from
    the teacher, the loss holding the teacher; fit moves the student to ``device``."""
    from methods.far import FARLoss, freeze_for_distillation, replace_attention
    from workbench.pipelines.far.budgets import BUDGETS

    b = BUDGETS["demo"]
    torch.manual_seed(0)
    teacher = VisionTransformer(**TINY).eval().to(teacher_device)
    student = replace_attention(teacher, b.far)
    freeze_for_distillation(student)
    loss = FARLoss(teacher, "combined", lam=b.lam, sim_input=b.sim_input, label_smoothing=b.distill.label_smoothing)
    return student.to(device).train(), loss


def _phase2_loss(teacher_device: str, device: str):
    """Sparsifiner's phase-2 objective as workbench.pipelines.sparsifiner.run builds it (the demo budget)."""
    from methods.sparsifiner import Phase2Loss, replace_attention, unfreeze_all
    from workbench.pipelines.sparsifiner.budgets import BUDGETS

    b = BUDGETS["demo"]
    torch.manual_seed(0)
    teacher = VisionTransformer(**TINY).eval().to(teacher_device)
    student = unfreeze_all(replace_attention(teacher, replace(b.method, keep_rate=0.25)))
    p2 = b.phase2
    loss = Phase2Loss(teacher, p2.token_weight, p2.cls_weight, p2.attn_weight, p2.kl_direction)
    return student.to(device).train(), loss


@pytest.mark.parametrize("build", [_far_loss, _phase2_loss], ids=["FARLoss", "Phase2Loss"])
def test_a_distillation_loss_runs_on_the_students_device_only(build):
    x = torch.randn(2, 3, 16, 16).to("meta")  # "meta" stands in for the rank's GPU, the CPU for another one
    y = torch.tensor([1, 3]).to("meta")
    student, loss_fn = build("cpu", "meta")  # a teacher left behind on another device
    with OneDevice() as rec, pytest.raises(RuntimeError, match="device"):
        loss_fn(student, x, y)
    assert rec.mixed, "an op mixed devices without being recorded"

    student, loss_fn = build("meta", "meta")  # ours: teacher and student on the rank's device
    with OneDevice() as rec:
        loss, parts = loss_fn(student, x, y)
        loss.backward()
    assert not rec.mixed and rec.devices == {"meta"}, rec.mixed[:3]
    assert parts and all(v.device.type == "meta" for v in parts.values() if isinstance(v, torch.Tensor))


# ------------------------------------------------------------------------------------- on a GPU only
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU host)")


@cuda
def test_far_training_under_the_paper_autocast_is_finite():
    """The paper budget's distillation phase (bfloat16 autocast): LSTMs run in float16 under a gradient scaler, and a
    few steps give finite losses, weights and (unscaled) gradients."""
    import methods.train as train
    from methods.far import FARLoss, freeze_for_distillation, replace_attention
    from workbench.pipelines.far.budgets import BUDGETS

    b = BUDGETS["paper"]
    assert b.distill.amp, "the paper budget no longer trains under autocast: this test checks nothing"
    cfg = replace(b.distill, epochs=2, batch_size=8, warmup_epochs=0, device="cuda", progress=False, num_workers=0)
    torch.manual_seed(0)
    teacher = VisionTransformer(**TINY).cuda().eval()
    student = freeze_for_distillation(replace_attention(teacher, b.far))
    assert train.grad_scaler(cfg, torch.device("cuda"), student) is not None
    dtypes = set()
    for m in student.modules():
        if isinstance(m, nn.LSTM):
            m.register_forward_hook(lambda mod, args, out: dtypes.add(out[0].dtype))
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 16, 16), torch.randint(0, 5, (64,)))
    hist = train.fit(student, data, None, cfg, loss_fn=FARLoss(teacher, "combined", lam=b.lam, sim_input=b.sim_input))
    assert dtypes == {torch.float16}, f"the LSTMs ran in {dtypes} under autocast (the docs say float16)"
    assert all(math.isfinite(h["train_loss"]) and math.isfinite(h["train_sim"]) for h in hist), hist
    trained = [p for p in student.parameters() if p.requires_grad]
    assert all(torch.isfinite(p).all() for p in trained)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in trained)


@cuda
def test_far_attributions_differentiate_eval_mode_lstms_on_the_gpu():
    from methods.far import replace_attention
    from workbench.analysis.attribution import integrated_gradients, saliency
    from workbench.analysis.dependency import model_dependency

    torch.manual_seed(0)
    far = replace_attention(VisionTransformer(**TINY)).cuda().eval()
    x = torch.randn(2, 3, 16, 16, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="cudnn RNN backward can only be called in training mode"):
        far(x)[:, 0].sum().backward()  # why methods.devices.differentiable exists
    target = torch.tensor([0, 3], device="cuda")
    attr, amap, gap = integrated_gradients(far, x.detach(), target, n_steps=8)
    sal, _ = saliency(far, x.detach(), target)
    deps = [model_dependency(far, x.detach(), layers=[0], queries=[0], method=m) for m in ("auto", "batched", "loop")]
    torch.testing.assert_close(deps[1], deps[0], rtol=1e-3, atol=1e-5)  # vmap through the native LSTM kernels
    torch.testing.assert_close(deps[2], deps[0], rtol=1e-3, atol=1e-5)
    assert all(torch.isfinite(t).all() for t in (attr, gap, sal, *deps)) and torch.backends.cudnn.enabled


@cuda
def test_attentionlite_column_shrink_passes_its_check_on_the_gpu():
    """The shrunk AttentionLite model equals the masked one within the pipeline's tolerance in full float32 (TF32,
    cuDNN's default for convolutions, alone differs by more)."""
    import timm

    import methods.attentionlite as al
    from workbench.pipelines.attentionlite.body import SHRINK_TOLERANCE

    torch.manual_seed(0)
    model = timm.create_model("sa_resnet_demo", num_classes=10).cuda()
    hook = al.SparseMomentum(model, 0.3, "column", epochs=1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.add_(torch.randn_like(m.weight) * 0.1)
    hook.apply(model)
    model.eval()
    small = al.shrink(model, hook.weight_masks())
    x = torch.randn(64, 1, 28, 28, device="cuda")
    with torch.no_grad(), exact_float32():
        gap = (small(x) - model(x)).abs().max().item()
    with torch.no_grad():
        tf32_gap = (small(x) - model(x)).abs().max().item()
    print(f"shrunk vs masked: {gap:.2e} in full float32, {tf32_gap:.2e} with the default TF32 flags")
    assert gap <= SHRINK_TOLERANCE
