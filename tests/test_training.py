"""Tests of calnotes.training: Trainer, History, predict_logits, exact resume."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from calnotes.training import (
    History,
    MixupTrainer,
    Trainer,
    eval_mode,
    predict_logits,
    seed_everything,
    select_device,
)

torch.set_num_threads(min(2, torch.get_num_threads()))

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


class TensorLoader:
    """Minimal loader with the calnotes interface: (x, y) batches, len(), set_epoch()."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 32,
                 shuffle: bool = True, seed: int = 0) -> None:
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.batch_size)

    def __iter__(self):
        n = len(self.y)
        if self.shuffle:
            gen = torch.Generator().manual_seed(1000 * self.seed + self.epoch)
            order = torch.randperm(n, generator=gen)
        else:
            order = torch.arange(n)
        for i in range(0, n, self.batch_size):
            idx = order[i : i + self.batch_size]
            yield self.x[idx], self.y[idx]


def blobs(n: int = 240, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Separable Gaussian blobs shaped as 1x4x4 images."""
    gen = torch.Generator().manual_seed(seed)
    centers = 2.0 * torch.randn(classes, 1, 4, 4, generator=gen)
    y = torch.arange(n) % classes
    x = centers[y] + 0.5 * torch.randn(n, 1, 4, 4, generator=gen)
    return x, y


def tiny_model(classes: int = 3, seed: int = 0) -> nn.Module:
    """MLP with dropout and batch norm: exercises the RNG and buffers in a resume."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(16, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(24, classes),
    )


def make_loaders(seed: int = 0) -> tuple[TensorLoader, TensorLoader]:
    x, y = blobs(seed=seed)
    return TensorLoader(x[:180], y[:180], seed=seed), TensorLoader(x[180:], y[180:], shuffle=False)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


KW = dict(lr=0.05, epochs=4, device="cpu", progress=False, seed=3)


# --------------------------------------------------------------------------- devices, seeds


def test_select_device() -> None:
    assert select_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device("auto").type == expected
    assert select_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        select_device("tpu-9000")
    with pytest.raises(TypeError, match="device"):
        select_device(3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            select_device("cuda")


def test_seed_everything_repeats_draws() -> None:
    seed_everything(7)
    a = (torch.rand(3), np.random.rand(3))  # noqa: NPY002
    seed_everything(7)
    b = (torch.rand(3), np.random.rand(3))  # noqa: NPY002
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    with pytest.raises(ValueError, match="seed"):
        seed_everything(-1)


# --------------------------------------------------------------------------- history


def test_history_columns_frame_and_json_round_trip() -> None:
    h = History()
    h.append({"epoch": 1, "train_loss": torch.tensor(0.5), "val_ece": np.float32(0.25)})
    h.append({"epoch": 2, "train_loss": 0.25, "val_ece": 0.125, "logit_norm": 3.0})
    assert len(h) == 2
    assert h["train_loss"] == [0.5, 0.25]
    assert h["logit_norm"] == [None, 3.0]
    assert h.columns == ["epoch", "train_loss", "val_ece", "logit_norm"]
    frame = h.to_frame()
    assert list(frame.columns) == h.columns and len(frame) == 2
    again = History.from_dict(json.loads(json.dumps(h.to_dict())))
    assert again == h
    with pytest.raises(KeyError, match="nope"):
        h["nope"]
    with pytest.raises(TypeError, match="record"):
        h.append([1, 2])
    with pytest.raises(ValueError, match="records"):
        History.from_dict({"epochs": []})


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"optimizer": "rmsprop"}, ValueError, "optimizer"),
        ({"schedule": "linear"}, ValueError, "schedule"),
        ({"epochs": 0}, ValueError, "epochs"),
        ({"epochs": 2.5}, TypeError, "epochs"),
        ({"lr": 0.0}, ValueError, "lr"),
        ({"lr": -1.0}, ValueError, "lr"),
        ({"lr": float("nan")}, ValueError, "lr"),
        ({"momentum": -0.1}, ValueError, "momentum"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"weight_decay": -1e-4}, ValueError, "weight_decay"),
        ({"gamma": 0.0}, ValueError, "gamma"),
        ({"seed": -1}, ValueError, "seed"),
        ({"nesterov": True, "momentum": 0.0}, ValueError, "nesterov"),
        ({"nesterov": True, "optimizer": "adam"}, ValueError, "nesterov"),
        ({"milestones": [0.5]}, ValueError, "milestones"),
        ({"schedule": "step", "milestones": [3, 2]}, ValueError, "milestones"),
        ({"schedule": "step", "milestones": [99]}, ValueError, "milestones"),
        ({"schedule": "step", "milestones": "1,2"}, TypeError, "milestones"),
        ({"device": "quantum"}, ValueError, "device"),
        ({"amp": "yes"}, TypeError, "amp"),
        ({"amp": 1}, TypeError, "amp"),
        ({"channels_last": "nhwc"}, TypeError, "channels_last"),
        ({"compile": 0}, TypeError, "compile"),
        ({"progress": 1}, TypeError, "progress"),
        ({"epoch_callback": 5}, TypeError, "epoch_callback"),
        ({"grad_clip": 0.0}, ValueError, "grad_clip"),
        ({"grad_clip": "2"}, TypeError, "grad_clip"),
    ],
)
def test_trainer_rejects_bad_arguments(kwargs, error, match) -> None:
    args = {"device": "cpu", "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        Trainer(tiny_model(), **args)


def test_trainer_rejects_bad_model_and_loss() -> None:
    with pytest.raises(TypeError, match="model"):
        Trainer("not a model", device="cpu")
    with pytest.raises(TypeError, match="loss_fn"):
        Trainer(tiny_model(), "ce", device="cpu")
    with pytest.raises(ValueError, match="trainable"):
        Trainer(nn.ReLU(), device="cpu")


def test_amp_true_on_cpu_trains_in_bfloat16_and_validates_in_float32() -> None:
    trainer = Trainer(tiny_model(), amp=True, device="cpu", progress=False)
    assert trainer.amp is True and trainer.fast_path.precision == "bfloat16-autocast"
    x = torch.randn(8, 16)
    y = torch.randint(0, 3, (8,))
    seen = []
    trainer.model.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    trainer._train_step(x, y)
    trainer.validate([(x, y)])
    assert seen == [torch.bfloat16, torch.float32]


@pytest.mark.parametrize(
    ("schedule", "milestones", "expected"),
    [
        ("none", None, [0.1, 0.1, 0.1, 0.1]),
        ("step", [0.5, 0.75], [0.1, 0.1, 0.01, 0.001]),
        ("step", [1, 3], [0.1, 0.01, 0.01, 0.001]),
        ("cosine", None, [0.1 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)]),
    ],
)
def test_learning_rate_schedules(schedule, milestones, expected) -> None:
    train, _ = make_loaders()
    trainer = Trainer(tiny_model(), lr=0.1, epochs=4, schedule=schedule, milestones=milestones,
                      device="cpu", progress=False)
    history = trainer.fit(train)
    assert history["lr"] == pytest.approx(expected)


# --------------------------------------------------------------------------- training


def test_trainer_learns_sklearn_digits() -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x = (x - x.mean()) / x.std()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    train = TensorLoader(x[:1400], y[:1400], batch_size=64)
    val = TensorLoader(x[1400:], y[1400:], batch_size=256, shuffle=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    history = Trainer(model, lr=0.05, epochs=5, device="cpu", progress=False).fit(train, val)
    assert len(history) == 5
    assert history["epoch"] == [1, 2, 3, 4, 5]
    assert history["val_acc"][-1] > 0.9  # chance is 0.1
    assert history["train_loss"][-1] < history["train_loss"][0]
    for key in ("lr", "train_loss", "train_acc", "val_loss", "val_ece", "val_acc",
                "val_logit_norm", "seconds"):
        assert all(isinstance(v, float) and math.isfinite(v) for v in history[key]), key
    assert all(0 <= v <= 1 for v in history["val_ece"] + history["train_acc"])
    assert model.training


def test_validation_metrics_match_metrics_module() -> None:
    from calnotes import metrics

    train, val = make_loaders()
    trainer = Trainer(tiny_model(), epochs=1, device="cpu", progress=False)
    record = trainer.fit(train, val).records[-1]
    logits, labels = predict_logits(trainer.model, val)
    probs = torch.softmax(logits, dim=1)
    assert record["val_loss"] == pytest.approx(float(metrics.nll(probs, labels)), rel=1e-5)
    assert record["val_ece"] == pytest.approx(float(metrics.ece(probs, labels, n_bins=15)),
                                              abs=1e-6)
    assert record["val_acc"] == pytest.approx(1 - float(metrics.error(probs, labels)))
    assert record["val_logit_norm"] == pytest.approx(float(logits.norm(dim=1).mean()), rel=1e-5)


def test_epoch_callback_adds_columns_and_custom_loss() -> None:
    calls = []

    def callback(epoch, trainer, record):
        calls.append(epoch)
        with torch.no_grad():
            record["weight_norm"] = float(sum(p.norm() ** 2 for p in trainer.model.parameters()))

    def loss_fn(logits, labels):
        return nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)

    train, _ = make_loaders()
    history = Trainer(tiny_model(), loss_fn, optimizer="adam", lr=1e-2, epochs=3, device="cpu",
                      progress=False, epoch_callback=callback).fit(train)
    assert calls == [1, 2, 3]
    assert len(history["weight_norm"]) == 3
    assert "val_loss" not in history.columns


@pytest.mark.parametrize("trainer", [Trainer, MixupTrainer])
@pytest.mark.parametrize("bad", [-1, 3, 5000])
def test_fit_names_labels_out_of_range(trainer, bad) -> None:
    x, y = blobs(n=64)
    y = y.clone()
    y[40] = bad
    loader = TensorLoader(x, y, shuffle=False)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        trainer(tiny_model(), epochs=1, device="cpu", progress=False).fit(loader)


@pytest.mark.parametrize("trainer", [Trainer, MixupTrainer])
def test_fit_names_float_labels(trainer) -> None:
    x, y = blobs(n=64)
    loader = TensorLoader(x, y.float(), shuffle=False)
    with pytest.raises(TypeError, match="labels must have an integer dtype"):
        trainer(tiny_model(), epochs=1, device="cpu", progress=False).fit(loader)


def test_divergence_is_reported() -> None:
    def nan_loss(logits, labels):
        return logits.sum() * float("nan")

    train, _ = make_loaders()
    with pytest.raises(FloatingPointError, match="diverged"):
        Trainer(tiny_model(), nan_loss, epochs=1, device="cpu", progress=False).fit(train)


def test_progress_bar_output(capsys) -> None:
    train, _ = make_loaders()
    Trainer(tiny_model(), epochs=1, device="cpu", progress=True).fit(train)
    assert "epoch" in capsys.readouterr().err
    Trainer(tiny_model(), epochs=1, device="cpu", progress=False).fit(train)
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- predict_logits


class ModeRecorder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 3)
        self.modes: list[bool] = []
        self.grad: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        self.grad.append(torch.is_grad_enabled())
        return self.linear(x.flatten(1))


@pytest.mark.parametrize("start_training", [True, False])
def test_predict_logits_shapes_and_modes(start_training: bool) -> None:
    x, y = blobs(n=50)
    model = ModeRecorder().train(start_training)
    logits, labels = predict_logits(model, TensorLoader(x, y, batch_size=16, shuffle=False))
    assert logits.shape == (50, 3) and logits.dtype == torch.float32
    assert labels.dtype == torch.int64 and torch.equal(labels, y)
    assert logits.device.type == "cpu" and labels.device.type == "cpu"
    assert model.modes == [False] * 4 and model.grad == [False] * 4
    assert model.training is start_training
    with torch.no_grad():
        assert torch.allclose(logits, model.linear(x.flatten(1)))


def test_predict_logits_rejects_bad_input() -> None:
    x, y = blobs(n=10)
    with pytest.raises(TypeError, match="model"):
        predict_logits(lambda t: t, TensorLoader(x, y))
    with pytest.raises(ValueError, match="no batches"):
        predict_logits(ModeRecorder(), [])
    with pytest.raises(ValueError, match="pairs"):
        predict_logits(ModeRecorder(), [x])


# --------------------------------------------------------------------------- checkpoints, resume


def test_resume_after_exception_is_bit_identical(tmp_path: Path) -> None:
    train, val = make_loaders()
    full = Trainer(tiny_model(), **KW)
    expected = full.fit(train, val)

    class Interrupt(Exception):
        pass

    def crash(epoch, trainer, record):
        if epoch == 3:  # the epoch-2 checkpoint is on disk; epoch 3 is lost
            raise Interrupt

    train, val = make_loaders()
    with pytest.raises(Interrupt):
        Trainer(tiny_model(), checkpoint_dir=tmp_path, epoch_callback=crash, **KW).fit(train, val)
    assert torch.load(tmp_path / "last.pt", weights_only=True)["epoch"] == 2
    torch.manual_seed(12345)  # disturb the global RNG: the checkpoint must restore it

    train, val = make_loaders()
    resumed = Trainer(tiny_model(seed=99), checkpoint_dir=tmp_path, **KW)
    history = resumed.fit(train, val)
    assert_same_state(params(resumed.model), params(full.model))
    assert history.without_timing() == expected.without_timing()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary files left

    # a finished checkpoint is loaded, not retrained
    again = Trainer(tiny_model(seed=5), checkpoint_dir=tmp_path,
                    epoch_callback=lambda *a: pytest.fail("trained again"), **KW)
    assert again.fit(train, val) == history
    assert_same_state(params(again.model), params(full.model))


def test_resume_refuses_a_different_configuration(tmp_path: Path) -> None:
    train, _ = make_loaders()
    Trainer(tiny_model(), checkpoint_dir=tmp_path, **{**KW, "epochs": 1}).fit(train)
    with pytest.raises(ValueError, match=r"different configuration.*epochs"):
        Trainer(tiny_model(), checkpoint_dir=tmp_path, **KW).fit(train)
    with pytest.raises(ValueError, match=r"lr: checkpoint 0.05 vs now 0.1"):
        Trainer(tiny_model(), checkpoint_dir=tmp_path, **{**KW, "epochs": 1, "lr": 0.1}).fit(train)
    with pytest.raises(ValueError, match="parameters"):
        Trainer(tiny_model(classes=4), checkpoint_dir=tmp_path, **{**KW, "epochs": 1}).fit(train)


def test_resume_refuses_a_checkpoint_of_another_run_config(tmp_path: Path) -> None:
    # The run config covers what the trainer cannot see (data subset, batch size,
    # augmentation): a checkpoint of another config is refused, key by key.
    train, _ = make_loaders()
    config = {"train_subset": 100, "batch_size": 32, "augment": False}
    one = {**KW, "epochs": 1}
    Trainer(tiny_model(), checkpoint_dir=tmp_path, run_config=config, **one).fit(train)
    with pytest.raises(ValueError, match=r"run_config.train_subset: checkpoint 100 vs now 200"):
        Trainer(tiny_model(), checkpoint_dir=tmp_path,
                run_config={**config, "train_subset": 200}, **one).fit(train)
    with pytest.raises(ValueError, match=r"run_config.batch_size: checkpoint 32 vs now None"):
        Trainer(tiny_model(), checkpoint_dir=tmp_path, **one).fit(train)
    same = Trainer(tiny_model(), checkpoint_dir=tmp_path, run_config=dict(config),
                   epoch_callback=lambda *a: pytest.fail("trained again"), **one)
    assert len(same.fit(train)) == 1 and same.epoch == 1  # its own config resumes
    with pytest.raises(TypeError, match="run_config"):
        Trainer(tiny_model(), run_config={"a": object()}, **one)


def test_checkpoint_fingerprint_digest_pinned_value(tmp_path: Path) -> None:
    # a stored checkpoint resumes only if this digest is unchanged: pin one value
    config = {"train_subset": 2000, "batch_size": 64, "augment": False, "model": "resnet14"}
    path = Trainer(tiny_model(), checkpoint_dir=tmp_path, run_config=config,
                   **KW).save_checkpoint()
    state = torch.load(path, weights_only=True)
    expected = "ff9f5fd3417c880b8490c1158f594afa8de4ba2e80d365a4dbf9fac15ba8c2b9"
    assert state["fingerprint_sha256"] == expected


@pytest.mark.parametrize("cut", [0, 10, 0.5])
def test_a_truncated_checkpoint_gives_an_error_naming_it(tmp_path: Path, cut: float) -> None:
    train, _ = make_loaders()
    Trainer(tiny_model(), checkpoint_dir=tmp_path, **{**KW, "epochs": 1}).fit(train)
    path = tmp_path / "last.pt"
    data = path.read_bytes()
    path.write_bytes(data[: int(cut * len(data)) if isinstance(cut, float) else cut])
    # was: a bare EOFError or RuntimeError from torch.load
    with pytest.raises(ValueError, match=rf"checkpoint {path} cannot be read.*Delete it"):
        Trainer(tiny_model(), checkpoint_dir=tmp_path, **KW).fit(train)


SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    torch.set_num_threads(int(sys.argv[3]))
    import test_training as t
    from calnotes.training import Trainer

    def die(epoch, trainer, record):
        if epoch == 3:  # after the epoch-2 checkpoint was written
            os.kill(os.getpid(), signal.SIGKILL)

    train, val = t.make_loaders()
    Trainer(t.tiny_model(), checkpoint_dir=sys.argv[2], epoch_callback=die, **t.KW).fit(train, val)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_resume_after_sigkill_is_bit_identical(tmp_path: Path) -> None:
    script = tmp_path / "train_and_die.py"
    script.write_text(SCRIPT)
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script), str(TESTS_DIR), str(ckpt), str(torch.get_num_threads())],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert torch.load(ckpt / "last.pt", weights_only=True)["epoch"] == 2

    train, val = make_loaders()
    full = Trainer(tiny_model(), **KW)
    expected = full.fit(train, val)
    train, val = make_loaders()
    resumed = Trainer(tiny_model(seed=1), checkpoint_dir=ckpt, **KW)
    history = resumed.fit(train, val)
    assert_same_state(params(resumed.model), params(full.model))
    assert history.without_timing() == expected.without_timing()
    assert history["epoch"] == [1, 2, 3, 4]


# --------------------------------------------------------------------------- CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_amp_channels_last_training() -> None:
    x, y = blobs(n=256)
    x = x.repeat(1, 3, 2, 2)  # (N, 3, 8, 8): channels_last needs 4-d input
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))
    train = TensorLoader(x[:192].cuda(), y[:192].cuda())
    val = TensorLoader(x[192:].cuda(), y[192:].cuda(), shuffle=False)
    trainer = Trainer(model, epochs=3, device="cuda", amp=True, channels_last=True, lr=0.05,
                      progress=False)
    history = trainer.fit(train, val)
    assert trainer.amp and trainer.channels_last
    assert all(math.isfinite(v) for v in history["val_loss"])
    assert history["val_acc"][-1] > 0.6
    logits, labels = predict_logits(model, val)
    assert logits.device.type == "cpu" and logits.dtype == torch.float32
    assert next(model.parameters()).device.type == "cuda"


def test_default_step_milestones_work_for_a_single_epoch():
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, schedule="step", epochs=1, device="cpu", progress=False)
    assert trainer.milestones == (1,)


def _plain_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


@pytest.mark.parametrize("trainer_class", [Trainer, MixupTrainer])
def test_grad_clip_rescales_the_gradient_before_weight_decay_and_momentum(trainer_class) -> None:
    x, y = blobs(n=32)
    options = dict(lr=0.1, momentum=0.9, weight_decay=5e-4, epochs=1, device="cpu",
                   progress=False, seed=7)
    clipped = trainer_class(_plain_model(), grad_clip=0.05, **options)
    free = trainer_class(_plain_model(), **options)
    reference = _plain_model()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    generator = torch.Generator().manual_seed(7)
    norms = []
    for _ in range(2):  # two steps: the momentum buffers hold clipped gradients
        clipped._train_step(x, y)
        free._train_step(x, y)
        if trainer_class is MixupTrainer:
            from calnotes.losses import MixupLoss, mixup_batch

            x_mixed, y_a, y_b, lam = mixup_batch(x, y, 0.2, generator)
            loss = MixupLoss()(reference(x_mixed), y_a, y_b, lam)
        else:
            loss = F.cross_entropy(reference(x), y)
        sgd.zero_grad()
        loss.backward()
        norms.append(float(nn.utils.clip_grad_norm_(reference.parameters(), 0.05)))
        sgd.step()
    assert min(norms) > 0.05  # the clip acted on both steps
    for (name, p), q in zip(clipped.model.named_parameters(), reference.parameters(),
                            strict=True):
        # float32, the same operations on the same batch: agreement to rounding
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7, msg=name)
    assert not torch.equal(free.model[1].weight, clipped.model[1].weight)
    assert "grad_clip" not in free.fingerprint()  # checkpoints of unclipped runs still resume
    assert clipped.fingerprint()["grad_clip"] == 0.05


# --------------------------------------------------------------------------- mixup


def test_mixup_trainer_step_is_the_mixup_loss_of_a_seeded_batch() -> None:
    from calnotes.losses import MixupLoss, mixup_batch

    x, y = blobs(n=32)
    model = tiny_model()
    start = params(model)
    trainer = MixupTrainer(model, alpha=0.4, lr=0.05, epochs=1, device="cpu", progress=False,
                           seed=7)
    torch.manual_seed(0)
    loss, _ = trainer._train_step(x, y)

    reference = tiny_model()
    reference.load_state_dict(start)
    x_mixed, y_a, y_b, lam = mixup_batch(x, y, 0.4, torch.Generator().manual_seed(7))
    assert 0.0 < lam < 1.0 and not torch.equal(y_a, y_b)
    torch.manual_seed(0)  # same dropout mask
    expected = MixupLoss()(reference(x_mixed), y_a, y_b, lam)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_mixup_trainer_learns_and_resumes_bit_identically(tmp_path: Path) -> None:
    train, val = make_loaders()
    full = MixupTrainer(tiny_model(), alpha=0.2, **KW)
    expected = full.fit(train, val)
    assert expected["val_acc"][-1] > 0.9

    def crash(epoch, trainer, record):
        if epoch == 3:
            raise KeyboardInterrupt

    train, val = make_loaders()
    with pytest.raises(KeyboardInterrupt):
        MixupTrainer(tiny_model(), alpha=0.2, checkpoint_dir=tmp_path, epoch_callback=crash,
                     **KW).fit(train, val)
    resumed = MixupTrainer(tiny_model(seed=4), alpha=0.2, checkpoint_dir=tmp_path, **KW)
    history = resumed.fit(train, val)
    assert history.without_timing() == expected.without_timing()
    assert_same_state(params(resumed.model), params(full.model))


def test_mixup_trainer_checks_alpha_and_refuses_a_plain_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="alpha"):
        MixupTrainer(tiny_model(), alpha=0.0, device="cpu")
    with pytest.raises(TypeError, match="alpha"):
        MixupTrainer(tiny_model(), alpha="0.2", device="cpu")
    train, val = make_loaders()
    Trainer(tiny_model(), checkpoint_dir=tmp_path, **{**KW, "epochs": 1}).fit(train, val)
    with pytest.raises(ValueError, match="trainer"):
        MixupTrainer(tiny_model(), checkpoint_dir=tmp_path, **{**KW, "epochs": 1}).fit(train, val)


@pytest.mark.parametrize("start_training", [True, False])
def test_eval_mode_restores_the_previous_mode_even_after_an_error(start_training: bool) -> None:
    model = tiny_model().train(start_training)
    with eval_mode(model) as inside:
        assert inside is model and not model.training
    assert model.training is start_training
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError("boom")
    assert model.training is start_training


# --------------------------------------------------------------------------- CPU speed


def lenet(seed: int = 0) -> nn.Module:
    from calnotes.models import build_model

    torch.manual_seed(seed)
    return build_model("lenet5", 10, 1, 28)


def test_channels_last_default_follows_the_model() -> None:
    from calnotes.models import build_model

    conv = Trainer(lenet(), device="cpu", progress=False)
    assert conv.channels_last
    weights = [p for p in conv.model.parameters() if p.ndim == 4]
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in weights)
    assert not weights[1].is_contiguous()  # the first conv has one input channel
    assert not Trainer(tiny_model(), device="cpu", progress=False).channels_last  # no conv
    resnet = build_model("resnet8", 10, 1, 28)  # batch norm: NHWC rounds much more
    assert not Trainer(resnet, device="cpu", progress=False).channels_last
    assert Trainer(resnet, device="cpu", progress=False, channels_last=True).channels_last
    assert not Trainer(lenet(), device="cpu", progress=False, channels_last=False).channels_last
    with pytest.raises(TypeError, match="channels_last"):
        Trainer(lenet(), device="cpu", channels_last="yes")


def _sgd_steps(model: nn.Module, batches, dtype: torch.dtype) -> torch.Tensor:
    """The Trainer's step written out (SGD, momentum 0.9, weight decay, constant lr)."""
    model = model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    for x, y in batches:
        loss = nn.functional.cross_entropy(model(x.to(dtype)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def test_channels_last_training_matches_nchw_up_to_float32_rounding() -> None:
    from calnotes.training.trainer import _is_channels_last

    gen = torch.Generator().manual_seed(3)
    batches = [(torch.rand(32, 1, 28, 28, generator=gen),
                torch.randint(0, 10, (32,), generator=gen)) for _ in range(4)]
    trained = {}
    for layout in (True, False):
        trainer = Trainer(lenet(), lr=0.05, weight_decay=5e-4, schedule="none", epochs=1,
                          device="cpu", progress=False, channels_last=layout, threads=1)
        trainer.fit(batches)
        assert _is_channels_last(trainer.model) == layout
        trained[layout] = torch.cat([p.detach().double().flatten()
                                     for p in trainer.model.parameters()])
    reference = _sgd_steps(lenet(), batches, torch.float64)
    # Both layouts are float32 roundings of the same four steps (the sums of each
    # convolution in another order): NHWC must stay as close to the float64 trajectory as
    # NCHW does, up to a factor for the different orders (observed: 1.2x), with a floor
    # of 4 float32 ulps of the largest parameter for an NCHW run that happens to be exact.
    nchw_error = float((trained[False] - reference).abs().max())
    nhwc_error = float((trained[True] - reference).abs().max())
    floor = 4 * torch.finfo(torch.float32).eps * float(reference.abs().max())
    assert nhwc_error <= 4 * max(nchw_error, floor), (nhwc_error, nchw_error, floor)


def test_predict_logits_feeds_nhwc_models_nhwc_batches() -> None:
    from calnotes.models import build_model

    torch.manual_seed(0)
    model = build_model("lenet5", 10, 3, 28).to(memory_format=torch.channels_last)
    seen = []
    model.register_forward_pre_hook(lambda _m, args: seen.append(
        (args[0].is_contiguous(memory_format=torch.channels_last), args[0].is_contiguous())))
    x = torch.rand(6, 3, 28, 28)
    batch = [(x, torch.zeros(6, dtype=torch.long))]
    logits, _ = predict_logits(model, batch)
    assert seen == [(True, False)]
    expected, _ = predict_logits(model.to(memory_format=torch.contiguous_format), batch)
    assert seen[1] == (False, True)
    # the same sums in another order: float32 rounding of logits of size ~1
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_fit_uses_the_thread_count_and_restores_it() -> None:
    before = torch.get_num_threads()
    seen = []
    trainer = Trainer(tiny_model(), epochs=2, device="cpu", progress=False, threads=1,
                      epoch_callback=lambda *_: seen.append(torch.get_num_threads()))
    train, val = make_loaders()
    trainer.fit(train, val)
    assert seen == [1, 1] and trainer.threads_used == 1
    assert torch.get_num_threads() == before
    kept = Trainer(tiny_model(), epochs=1, device="cpu", progress=False, threads=None)
    kept.fit(train, val)
    assert kept.threads_used == before


@pytest.mark.parametrize(("threads", "error"), [(0, ValueError), ("many", TypeError),
                                                (True, TypeError), (1.5, TypeError)])
def test_threads_are_checked(threads, error) -> None:
    with pytest.raises(error, match="threads"):
        Trainer(tiny_model(), device="cpu", threads=threads)


def test_auto_threads_are_asked_once_and_kept_for_a_resumed_run(tmp_path: Path,
                                                                   monkeypatch) -> None:
    import calnotes.training.trainer as training

    answers = iter([1, 2])
    monkeypatch.setattr(training, "auto_threads", lambda: next(answers))
    seen = []

    def record(epoch, _trainer, _record):
        seen.append(torch.get_num_threads())
        if epoch == 2 and len(seen) == 2:
            raise KeyboardInterrupt  # stop after the second epoch's checkpoint

    train, val = make_loaders()
    first = Trainer(tiny_model(), epochs=4, device="cpu", progress=False,
                    checkpoint_dir=tmp_path, epoch_callback=record)
    with pytest.raises(KeyboardInterrupt):
        first.fit(train, val)
    # the interrupted epoch 2 has no checkpoint; epoch 1's recorded 1 thread
    resumed = Trainer(tiny_model(), epochs=4, device="cpu", progress=False,
                      checkpoint_dir=tmp_path, epoch_callback=record)
    resumed.fit(train, val)  # auto_threads would now answer 2
    assert seen == [1, 1, 1, 1, 1] and resumed.threads_used == 1
    assert next(answers) == 2  # asked once only
