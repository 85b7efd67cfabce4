"""Training loop and run records: resume exactness, reuse, config conflicts, DDP."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

import methods.teachers  # noqa: F401
from methods.train import TrainConfig, TrainHook, fit
from workbench.data import DemoDataset
from workbench.runs import RunError, ensure_run, open_run, sha256_file

pytestmark = pytest.mark.integration

CFG = TrainConfig(epochs=3, batch_size=32, lr=1e-3, warmup_epochs=1, device="cpu", progress=False)


def _data():
    return DemoDataset("train", train_transform=True, limit=96), DemoDataset("val", limit=32)


def _strip(history):
    return [{k: v for k, v in m.items() if k != "epoch_time_s"} for m in history]


def test_interrupted_training_resumes_to_same_result(tmp_path):
    train, val = _data()
    torch.manual_seed(0)
    full = timm.create_model("vit_demo")
    init = {k: v.clone() for k, v in full.state_dict().items()}
    h_full = fit(full, train, val, CFG, ckpt_dir=tmp_path / "a")

    part = timm.create_model("vit_demo")
    part.load_state_dict(init)
    h1 = fit(part, train, val, CFG, ckpt_dir=tmp_path / "b", stop_after=1)  # "interrupted" after epoch 0
    assert len(h1) == 1
    resumed = timm.create_model("vit_demo")  # a fresh process would rebuild the model from scratch
    h2 = fit(resumed, train, val, CFG, ckpt_dir=tmp_path / "b")
    assert _strip(h2) == _strip(h_full)
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    assert load_file(str(tmp_path / "b" / "model.safetensors")).keys() == full.state_dict().keys()


def test_nan_loss_is_a_clear_error():
    train, _ = _data()
    model = timm.create_model("vit_demo")

    def bad_loss(m, x, y):
        return m(x).sum() * float("nan"), {}

    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        fit(model, train, None, replace(CFG, epochs=1), loss_fn=bad_loss)


def test_run_reuse_resume_and_conflict():
    calls = []

    def body(run):
        calls.append(run.id)
        run.log_epoch(0, {"val_acc": 0.5})
        (run.dir / "model.safetensors").write_bytes(b"x")
        return {"val_acc": 0.5}

    cfg = {"method": "teacher", "model_name": "vit_demo", "profile": "smoke", "lr": 1,
           "train": {"epochs": 2, "eval_every": 1, "progress": True}}
    run = ensure_run("unit-run", cfg, body, log=lambda *_: None)
    assert run.status == "complete" and run.manifest["results"] == {"val_acc": 0.5}
    assert run.manifest["checkpoint_sha256"] and run.manifest["wall_time_s"] >= 0
    ensure_run("unit-run", cfg, body, log=lambda *_: None)
    assert calls == ["unit-run"]  # reused, not retrained
    # what changes only the logging (nested anywhere) still names the same result; anything else does not
    ensure_run("unit-run", {**cfg, "train": {"epochs": 2, "eval_every": 4, "progress": False}}, body, log=lambda *_: None)
    assert calls == ["unit-run"]
    with pytest.raises(RunError, match="different config"):
        ensure_run("unit-run", {**cfg, "train": {"epochs": 3, "eval_every": 4}}, body, log=lambda *_: None)
    with pytest.raises(RunError, match="different config"):
        ensure_run("unit-run", {**cfg, "lr": 2}, body, log=lambda *_: None)
    ensure_run("unit-run", {**cfg, "lr": 2}, body, force=True, log=lambda *_: None)
    assert len(calls) == 2 and open_run("unit-run").config["lr"] == 2

    # An interrupted run resumes: body is called again on the same directory.
    def crash(run):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ensure_run("unit-crash", cfg, crash, log=lambda *_: None)
    assert open_run("unit-crash").status == "interrupted"
    ensure_run("unit-crash", cfg, body, log=lambda *_: None)
    assert open_run("unit-crash").status == "complete"


def test_find_run_is_the_one_answer_to_is_this_a_run(tmp_path, monkeypatch):
    from workbench.runs import Run, find_run

    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path))
    run = ensure_run("found", {"a": 1}, lambda run: {"x": 1}, log=lambda s: None)
    assert find_run("found").dir == find_run(str(run.dir)).dir == find_run(run).dir == run.dir
    assert find_run("vit_demo") is None and find_run(str(tmp_path / "nowhere")) is None
    assert isinstance(find_run("found"), Run)
    with pytest.raises(RunError, match="no run 'vit_demo'"):
        open_run("vit_demo")


def test_a_run_in_use_by_another_process_waits_for_it(tmp_path):
    """The per-run lock (filelock) makes a second process wait until the first lets go, then reuse its work."""
    import time

    env = {**os.environ, "WORKBENCH_HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom workbench.runs import ensure_run\n"
         "def body(run):\n    print('held', flush=True)\n    time.sleep(3)\n    return {'x': 1}\n"
         "ensure_run('locked', {'a': 1}, body, log=lambda s: None)\n"],
        env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        lines: list[str] = []
        old = os.environ.get("WORKBENCH_HOME")
        os.environ["WORKBENCH_HOME"] = str(tmp_path)
        try:
            t0 = time.perf_counter()
            run = ensure_run("locked", {"a": 1}, lambda run: {"x": 2}, log=lines.append)
        finally:
            if old is None:
                del os.environ["WORKBENCH_HOME"]
            else:
                os.environ["WORKBENCH_HOME"] = old
        assert any("in use by another process" in ln for ln in lines) and time.perf_counter() - t0 > 1
        assert run.manifest["results"] == {"x": 1}  # the holder's run, reused (not run again)
    finally:
        holder.wait(timeout=60)
def test_failed_runs_are_retried_or_replaced_and_force_spares_what_was_built_on_them():
    """A failed run is marked failed (with its error); the same config resumes it in place, another config replaces it
    (nothing can be built on an unfinished run); --force refuses a run whose id other methods' configs name."""
    seen = []

    def fail(run):
        (run.dir / "partial").write_text("epoch 1 of 3")
        raise RuntimeError("out of memory (simulated)")

    def body(run):
        seen.append(sorted(p.name for p in run.dir.iterdir()))
        (run.dir / "model.safetensors").write_bytes(b"x")
        return {"val_acc": 0.5}

    quiet = lambda *_: None  # noqa: E731
    cfg = {"method": "teacher", "model_name": "vit_demo", "profile": "smoke", "lr": 1}
    with pytest.raises(RuntimeError, match="out of memory"):
        ensure_run("unit-fail", cfg, fail, log=quiet)
    run = open_run("unit-fail")
    assert run.status == "failed" and "out of memory" in run.manifest["error"]
    lines = []
    ensure_run("unit-fail", cfg, body, log=lines.append)  # the same command: resumed where it stopped
    assert "partial" in seen[-1] and any("resuming failed run unit-fail" in line for line in lines)
    assert open_run("unit-fail").status == "complete"

    with pytest.raises(RuntimeError):
        ensure_run("unit-fail2", cfg, fail, log=quiet)
    ensure_run("unit-fail2", {**cfg, "lr": 2}, body, log=lines.append)  # another config: a fresh run, not a clash
    assert "partial" not in seen[-1] and open_run("unit-fail2").config["lr"] == 2

    student = {"method": "far", "teacher": {"run": "unit-fail", "model_name": "vit_demo"}}
    ensure_run("unit-student", student, body, log=quiet)
    with pytest.raises(RunError, match="unit-student"):
        ensure_run("unit-fail", {**cfg, "lr": 3}, body, force=True, log=quiet)
    assert open_run("unit-fail").config["lr"] == 1  # untouched
    ensure_run("unit-student", student, body, force=True, log=quiet)  # nothing is built on the student: allowed


def test_teacher_run_end_to_end(smoke_teacher):
    run = smoke_teacher("vit")
    m = run.manifest
    assert m["status"] == "complete" and 0 <= m["results"]["val_acc"] <= 1
    assert m["versions"]["torch_version"] == torch.__version__
    assert len(run.metrics()) == m["results"]["epochs"]
    from workbench.models import load_model

    loaded = load_model(run.id)
    assert loaded.source.run == run.id and loaded.source.checkpoint_sha256 == m["checkpoint_sha256"]
    assert not loaded.model.training


def test_teacher_weights_do_not_depend_on_what_ran_before(smoke_teacher, tmp_path, monkeypatch):
    """The teacher's initialisation is seeded: a retrain after other random draws (e.g. in a figures worker that
    trained another teacher first) ends with the same weights. In a home of its own: the session's teacher has
    students built on it (other tests), which --force rightly refuses to replace."""
    from workbench.pipelines.teacher import train_teacher

    first = smoke_teacher("cnn").manifest["checkpoint_sha256"]
    monkeypatch.setenv("WORKBENCH_HOME", str(tmp_path / "home"))
    torch.manual_seed(1234)
    torch.rand(1000)  # move the global generator somewhere else
    again = train_teacher("cnn", "smoke", device="cpu", log=lambda *_: None)
    assert again.manifest["checkpoint_sha256"] == first


DDP_SCRIPT = """
import hashlib, os, sys, torch, timm
import methods.teachers
from methods.train import TrainConfig, TrainHook, fit
from workbench.data import DemoDataset
torch.manual_seed(0)
model = timm.create_model("vit_demo")
cfg = TrainConfig(epochs=2, batch_size=32, lr=1e-3, warmup_epochs=0, device="cpu", progress=False)
hist = fit(model, DemoDataset("train", train_transform=True, limit=128), DemoDataset("val", limit=64), cfg,
           ckpt_dir=sys.argv[1] if os.environ["RANK"] == "0" else None)
h = hashlib.sha256(b"".join(v.detach().numpy().tobytes() for v in model.state_dict().values())).hexdigest()
open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.txt"), "w").write(h + " " + repr(hist[-1]["val_acc"]))
"""


def test_torchrun_two_processes_identical_weights(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517", str(script), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (tmp_path / "rank0.txt").read_text(), (tmp_path / "rank1.txt").read_text()
    assert r0 == r1  # same weights and same all-reduced accuracy on both ranks
    assert (tmp_path / "model.safetensors").exists()
    # and the weights changed from the seed-0 initialisation, i.e. training happened
    torch.manual_seed(0)
    init = timm.create_model("vit_demo").state_dict()
    trained = load_file(str(tmp_path / "model.safetensors"))
    assert not torch.equal(init["head.weight"], trained["head.weight"])


class _DecayingMask(TrainHook):
    """A stateful hook like sparse momentum's: zeroes the smallest weights of the head after every step, and prunes
    a growing share at every epoch end (its state, a mask and a counter, must survive a resume)."""

    def __init__(self):
        self.mask: torch.Tensor | None = None
        self.epochs = 0
        self.seen_optimizer = False

    def after_step(self, model, optimizer):
        self.seen_optimizer = isinstance(optimizer, torch.optim.Optimizer)
        if self.mask is not None:
            with torch.no_grad():
                model.head.weight.mul_(self.mask)

    def on_epoch_end(self, model, optimizer, epoch):
        self.epochs += 1
        w = model.head.weight.detach().abs()
        self.mask = (w > w.flatten().kthvalue(int(0.2 * self.epochs * w.numel())).values).float()
        return {"density": self.mask.mean().item()}

    def state_dict(self):
        return {"mask": self.mask, "epochs": self.epochs}

    def load_state_dict(self, state):
        self.mask, self.epochs = state["mask"], state["epochs"]


def test_hook_state_and_optimizer_survive_a_resume(tmp_path):
    train, val = _data()
    torch.manual_seed(0)
    full = timm.create_model("vit_demo")
    init = {k: v.clone() for k, v in full.state_dict().items()}
    h_full = _DecayingMask()
    hist_full = fit(full, train, val, CFG, hooks=[h_full], ckpt_dir=tmp_path / "a")
    assert h_full.seen_optimizer and [round(m["density"], 3) for m in hist_full] == [0.8, 0.6, 0.4]

    part = timm.create_model("vit_demo")
    part.load_state_dict(init)
    fit(part, train, val, CFG, hooks=[_DecayingMask()], ckpt_dir=tmp_path / "b", stop_after=1)
    resumed = _DecayingMask()  # a fresh process: the hook's state comes from the checkpoint
    hist = fit(part, train, val, CFG, hooks=[resumed], ckpt_dir=tmp_path / "b")
    assert resumed.epochs == 3 and torch.equal(resumed.mask, h_full.mask)
    assert _strip(hist) == _strip(hist_full)
    for k, v in full.state_dict().items():
        assert torch.equal(v, part.state_dict()[k]), k


# --------------------------------------------------------------------------- the paper profile


def _tiny_image_folder(root):
    """2 classes x 4 training (2 held-out) crops of the bundled skimage photos, as a user's ImageFolder of JPEGs."""
    import skimage.data
    from PIL import Image

    photos = {"cat": ("chelsea", "cat"), "scene": ("astronaut", "coffee")}
    for split, n in (("train", 4), ("val", 2)):
        for cls, names in photos.items():
            (root / split / cls).mkdir(parents=True)
            for i in range(n):
                img = getattr(skimage.data, names[i % 2])()
                h, w = img.shape[:2]
                Image.fromarray(img[i * 10: h - i * 10, i * 7: w - i * 7]).save(root / split / cls / f"{i}.jpg")
    return root


def test_mixup_and_repeated_augmentation_resume_exactly(tmp_path):
    """fit's batch_transform (timm Mixup) and sampler (timm RepeatAugSampler) keep an interrupted run exact."""
    from methods.train import mixup_cutmix, repeated_augmentation, soft_target_cross_entropy

    train, val = _data()
    seen = []

    def loss_fn(model, images, targets):
        seen.append(targets.shape)
        return soft_target_cross_entropy()(model, images, targets)

    opts = dict(loss_fn=loss_fn, batch_transform=mixup_cutmix(10), sampler=repeated_augmentation(3))
    torch.manual_seed(0)
    full = timm.create_model("vit_demo")
    init = {k: v.clone() for k, v in full.state_dict().items()}
    h_full = fit(full, train, val, CFG, ckpt_dir=tmp_path / "a", **opts)
    assert seen[0] == (32, 10)  # soft (mixed, smoothed) targets reached the loss
    assert len(seen) == 3 * (96 // 32)  # RepeatAugSampler keeps one pass per epoch; full batches only
    part = timm.create_model("vit_demo")
    part.load_state_dict(init)
    fit(part, train, val, CFG, ckpt_dir=tmp_path / "b", stop_after=1, **opts)
    resumed = timm.create_model("vit_demo")
    h2 = fit(resumed, train, val, CFG, ckpt_dir=tmp_path / "b", **opts)
    assert _strip(h2) == _strip(h_full)
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k
    # a set smaller than one batch (a trial on a few images) trains on one even batch of all of it
    seen.clear()
    fit(timm.create_model("vit_demo"), DemoDataset("train", limit=15), None, replace(CFG, epochs=1), **opts)
    assert [s[0] for s in seen] == [14]
    with pytest.raises(ValueError, match="fewer than one batch"):
        fit(timm.create_model("vit_demo"), DemoDataset("train", limit=1), None, CFG, **opts)


def test_paper_profile_trains_the_papers_backbone(tmp_path):
    """--profile paper: deit_small_patch16_224 at 224 on an ImageFolder with the DeiT recipe (one tiny epoch, CPU)."""
    from workbench.models import create_model, load_model
    from workbench.pipelines import budget
    from workbench.pipelines.teacher import resolve_teacher, train_teacher

    root = _tiny_image_folder(tmp_path / "data")
    quiet = lambda *_: None  # noqa: E731
    with pytest.raises(ValueError, match="--arch swin --profile paper --data ROOT"):
        resolve_teacher(None, "paper", default_arch="swin", family="Swin", log=quiet)  # no real teacher yet
    run = train_teacher("vit", "paper", data=str(root), epochs=1, batch_size=4, device="cpu", log=quiet)
    # the id names the model, the data (folder name, 4 hex digits of its path) and the shortened budget
    assert run.id.startswith("teacher-deit_small_patch16_224-paper+data_") and run.id.endswith(".e1.b4"), run.id
    assert run.config["model_name"] == "deit_small_patch16_224" and run.manifest["arch"] == "vit"
    assert run.config["model_kwargs"] == {"num_classes": 2}
    assert run.config["train"]["lr"] == pytest.approx(5e-4 * 4 / 512) and run.config["train"]["label_smoothing"] == 0.1
    assert run.config["augment"] == {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25, "mixup": 0.8,
                                     "cutmix": 1.0, "repeats": 3, "interpolation": "bicubic"}
    assert budget("teacher", "paper").config("vit").num_workers >= 1
    loaded = load_model(run.id)
    assert loaded.input_size == (3, 224, 224) and type(loaded.model).__name__ == "VisionTransformer"
    assert loaded.model.embed_dim == 384 and len(loaded.model.blocks) == 12  # DeiT-S
    torch.manual_seed(0)
    init = create_model("deit_small_patch16_224", num_classes=2).state_dict()
    assert not torch.equal(init["head.weight"], loaded.model.state_dict()["head.weight"])  # it trained
    assert len(run.metrics()) == 1 and 0 <= run.manifest["results"]["val_acc"] <= 1
    ref = resolve_teacher(None, "paper", default_arch="vit", family="ViT", log=quiet)
    assert ref.run == run.id and ref.model_name == "deit_small_patch16_224"
    assert ref.tag.endswith(".e1.b4-paper")  # the profile last in the students' ids
    with pytest.raises(ValueError, match="would be downloaded"):
        create_model("deit_small_patch16_224", pretrained=True)


def test_paper_profile_records_a_pretrained_checkpoint(tmp_path):
    """--checkpoint W --epochs 0: W becomes the teacher as it is (its 1000-class head re-initialised for 2 classes)."""
    from safetensors.torch import save_file

    from workbench.models import create_model, load_model
    from workbench.pipelines.teacher import train_teacher

    root = _tiny_image_folder(tmp_path / "data")
    torch.manual_seed(1)
    imagenet = create_model("deit_tiny_patch16_224").state_dict()  # stands in for downloaded ImageNet weights
    save_file(imagenet, tmp_path / "deit_t.safetensors")
    lines = []
    run = train_teacher("vit", "paper", data=str(root), model_name="deit-t", checkpoint=str(tmp_path / "deit_t.safetensors"),
                        epochs=0, device="cpu", log=lines.append)
    assert run.id.startswith("teacher-deit_tiny_patch16_224-paper+data_") and run.manifest["results"]["epochs"] == 0
    assert run.id.endswith(f".ck{sha256_file(tmp_path / 'deit_t.safetensors')[:8]}.e0")
    assert any("re-initialised" in line for line in lines)
    state = load_model(run.id).model.state_dict()
    assert state["head.weight"].shape == (2, 192)
    assert all(torch.equal(v, imagenet[k]) for k, v in state.items() if not k.startswith("head."))
    with pytest.raises(ValueError, match="--checkpoint"):
        train_teacher("vit", "paper", data=str(root), model_name="deit-t", epochs=0, device="cpu", log=lines.append)


@pytest.mark.parametrize("opt", ["adamw", "momentum"])
def test_foreach_update_gives_the_per_tensor_loops_weights(opt):
    """fit's ``foreach=True`` (methods.train.foreach_kw) leaves training bit for bit what the per-tensor loop computes."""
    from timm.optim import create_optimizer_v2

    from methods.far import replace_attention
    from methods.train import foreach_kw

    assert foreach_kw(opt) == {"foreach": True} and foreach_kw("lamb") == {}
    torch.manual_seed(0)
    base = replace_attention(timm.create_model("vit_demo"))  # LSTMs, norms, biases: many small tensors in two groups
    models = {False: base, True: replace_attention(timm.create_model("vit_demo"))}
    models[True].load_state_dict(base.state_dict())
    start = {n: t.clone() for n, t in base.state_dict().items()}
    opts = {k: create_optimizer_v2(m, opt=opt, lr=1e-2, weight_decay=0.05, foreach=k) for k, m in models.items()}
    assert opts[True].defaults["foreach"] is True and opts[False].defaults["foreach"] is False
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 1, 28, 28, generator=gen), torch.randint(0, 10, (4,), generator=gen)) for _ in range(3)]
    for k, model in models.items():
        for x, y in batches:
            opts[k].zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opts[k].step()
    a, b = models[False].state_dict(), models[True].state_dict()
    assert not torch.equal(a["head.weight"], start["head.weight"])  # the steps moved the weights
    assert all(torch.equal(a[n], b[n]) for n in a), [n for n in a if not torch.equal(a[n], b[n])][:5]


def test_persistent_workers_resume_exactly(tmp_path):
    """One loader with persistent workers serves every epoch; the workers reseed from each epoch's seed, so a resumed
    run draws the same augmentations (the demo's batched jitter runs in the workers) as an uninterrupted one."""
    train, val = _data()
    cfg = replace(CFG, num_workers=2)
    torch.manual_seed(0)
    full = timm.create_model("vit_demo")
    init = {k: v.clone() for k, v in full.state_dict().items()}
    h_full = fit(full, train, val, cfg, ckpt_dir=tmp_path / "a")
    part = timm.create_model("vit_demo")
    part.load_state_dict(init)
    fit(part, train, val, cfg, ckpt_dir=tmp_path / "b", stop_after=1)
    resumed = timm.create_model("vit_demo")
    h2 = fit(resumed, train, val, cfg, ckpt_dir=tmp_path / "b")
    assert _strip(h2) == _strip(h_full)
    for k, v in full.state_dict().items():
        assert torch.equal(v, resumed.state_dict()[k]), k


def test_workers_default_to_none_on_the_cpu_and_several_per_rank_on_cuda(monkeypatch):
    from methods.train import workers_for

    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert workers_for(CFG, torch.device("cpu")) == 0  # CFG leaves num_workers at None: auto
    assert workers_for(CFG, torch.device("cuda")) == 4  # 32 CPUs over 8 ranks
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert workers_for(CFG, torch.device("cuda")) == 8  # at most 8
    assert workers_for(replace(CFG, num_workers=3), torch.device("cuda")) == 3


@pytest.mark.parametrize("workers", [0, 1])
def test_a_progress_bar_does_not_change_what_is_trained(workers, monkeypatch):
    """The same seeded training gives bit-identical weights with the progress bar shown or not (a terminal vs the
    figures' worker processes, which turn bars off). tqdm.auto's bar takes its own iterator of what it wraps: the
    loaders of earlier versions then drew their workers' base seed twice from the shuffle's generator (another order:
    AttentionLite's seed-1 demo run came out 92.8 % or 92.9 % with another checkpoint by how it was launched), and
    persistent workers prefetch for that iterator (their augmentations move on)."""
    train, val = DemoDataset("train", train_transform=True, limit=64), DemoDataset("val", limit=16)
    cfg = replace(CFG, epochs=2, seed=1, num_workers=workers)
    weights = {}
    for shown in (False, True):
        monkeypatch.setenv("WORKBENCH_PROGRESS", "1" if shown else "0")
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
        torch.manual_seed(1)
        model = timm.create_model("vit_demo")
        fit(model, train, val, replace(cfg, progress=shown))
        weights[shown] = model.state_dict()
    assert all(torch.equal(weights[False][k], weights[True][k]) for k in weights[False])
