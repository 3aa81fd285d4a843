"""Tests of calnotes.training.meta: GammaNet and the meta-regularization trainer."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from calnotes.losses import RANKED_DECE, dece
from calnotes.metrics import sece
from calnotes.training import Trainer
from calnotes.training.meta import (
    GAMMA_FLOOR,
    OUTER_LOSSES,
    GammaNet,
    LearnableL2,
    MetaCalibrationTrainer,
    MetaTrainer,
)

torch.set_num_threads(min(2, torch.get_num_threads()))


class TinyNet(nn.Module):
    """Model with the calnotes interface: features(x) -> (B, d), head: nn.Linear."""

    def __init__(self, d_in: int = 4, d: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d), nn.Tanh())
        self.head = nn.Linear(d, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ListLoader:
    """Fixed batches with len() and set_epoch(); reshuffles per epoch when asked to.
    Counts the batches it yields and records the epochs it is set to."""

    def __init__(self, x, y, batch_size: int, shuffle: bool = False) -> None:
        self.x, self.y, self.bs, self.shuffle, self.epoch = x, y, batch_size, shuffle, 0
        self.yielded, self.epochs_set = 0, []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs_set.append(epoch)

    def __len__(self) -> int:
        return -(-len(self.y) // self.bs)

    def __iter__(self):
        n = len(self.y)
        order = (torch.randperm(n, generator=torch.Generator().manual_seed(self.epoch))
                 if self.shuffle else torch.arange(n))
        for i in range(0, n, self.bs):
            idx = order[i : i + self.bs]
            self.yielded += 1
            yield self.x[idx], self.y[idx]


def blobs(n: int, seed: int = 0, d_in: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.3).long()
    return x, y


def make_loaders():
    xt, yt = blobs(160, seed=1)
    xv, yv = blobs(60, seed=2)
    return ListLoader(xt, yt, 32, shuffle=True), ListLoader(xv, yv, 24)  # 5 vs 3 batches


def make_meta_loader() -> ListLoader:
    xm, ym = blobs(40, seed=7)
    return ListLoader(xm, ym, 16, shuffle=True)  # 3 batches, reshuffled per pass


def make_pair(seed: int = 0) -> tuple[TinyNet, GammaNet]:
    torch.manual_seed(seed)
    return TinyNet(), GammaNet(8, heads=4)


KW = dict(epochs=3, lr=0.05, device="cpu", progress=False, seed=3, meta_lr=1e-2)


def state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------------------------- GammaNet


def test_gamma_positive_and_finite_on_random_and_adversarial_features() -> None:
    torch.manual_seed(0)
    net = GammaNet(16, heads=8, tau=0.5)
    cases = [
        torch.randn(64, 16),
        torch.zeros(5, 16),
        torch.full((3, 16), 1e30),
        torch.tensor([[1e30, -1e30] * 8, [-1e30, 1e30] * 8]),
        torch.randn(4, 16) * 1e6,
    ]
    bound = (net.A.t() @ net.W).abs().max().item() / net.tau + GAMMA_FLOOR
    for x in cases:
        x = x.requires_grad_()
        gamma = net(x)
        assert gamma.shape == (x.shape[0],)
        assert torch.isfinite(gamma).all() and (gamma > 0).all()
        assert (gamma <= bound * (1 + 1e-5)).all()  # a convex mix of the keys
        gamma.sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in net.parameters())
        assert torch.isfinite(x.grad).all()
        net.zero_grad()
    # W = 0 makes x~ W exactly 0: the floor keeps gamma positive, and gradients stay finite
    with torch.no_grad():
        net.W.zero_()
    gamma = net(torch.randn(6, 16))
    assert torch.equal(gamma, torch.full((6,), GAMMA_FLOOR))


def test_gamma_matches_the_formula() -> None:
    torch.manual_seed(1)
    net = GammaNet(5, heads=3, tau=2.0).double()
    x = torch.randn(7, 5, dtype=torch.float64)
    a = x @ net.A
    p = torch.exp(a) / torch.exp(a).sum(1, keepdim=True)
    expected = ((p @ net.A.t()) @ net.W).squeeze(1).abs() / 2.0 + GAMMA_FLOOR
    torch.testing.assert_close(net(x), expected)


# --------------------------------------------------------------------------- hypergradient


def _double_trainer(outer: str, inner_params: str, **options) -> tuple[MetaTrainer, tuple]:
    torch.manual_seed(4)
    model, gnet = TinyNet().double(), GammaNet(8, heads=4).double()
    options = {"inner_lr": 0.5, "device": "cpu", "progress": False, "epochs": 1,
               "sece_bandwidth": 0.2, **options}
    trainer = MetaTrainer(model, gnet, outer=outer, inner_params=inner_params, **options)
    x, y = blobs(24, seed=5)
    xv, yv = blobs(20, seed=6)
    return trainer, (x.double(), y, xv.double(), yv)


#: The look-ahead's step size in the hypergradient tests: with the default summed inner
#: loss over 24 samples the head moves by 2.4 times the mean gradient (the reference's
#: lr 0.1 at B = 128 moves it by 12.8 times).
INNER_LR = 0.1


@pytest.mark.parametrize(("outer", "inner_params", "options"), [
    ("sece", "head", {}),
    ("sece+ce", "head", {}),
    ("dece", "head", {}),
    ("ce+0.5dece", "head", {}),
    ("dece", "head", {"dece_form": "sharpened"}),
    ("sece", "all", {}),
    ("sece", "head", {"inner_reduction": "mean"}),
])
def test_hypergradient_matches_central_differences(outer, inner_params, options) -> None:
    trainer, batch = _double_trainer(outer, inner_params, **options)
    _, hyper = trainer.hypergradient(*batch, inner_lr=INNER_LR)
    eps = 1e-6
    for param, grad in zip(trainer.gamma_net.parameters(), hyper, strict=True):
        assert grad is not None
        numeric = torch.zeros_like(param)
        flat = param.data.view(-1)
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + eps
            up = trainer.hypergradient(*batch, inner_lr=INNER_LR)[0].item()
            flat[i] = old - eps
            down = trainer.hypergradient(*batch, inner_lr=INNER_LR)[0].item()
            flat[i] = old
            numeric.view(-1)[i] = (up - down) / (2 * eps)
        assert numeric.abs().max() > 1e-8  # the check is not vacuous
        # central differences in float64 with eps = 1e-6: truncation O(eps^2 f^(3)) and
        # rounding O(1e-16 / eps) are both far below 1e-4 of these gradients
        torch.testing.assert_close(grad, numeric, rtol=1e-4, atol=1e-8)


def _by_hand(trainer: MetaTrainer, batch: tuple, inner_lr: float, reduction: str):
    """Steps (1)-(3) written out: gamma from the features, one SGD step of the head on the
    focal loss summed (or averaged) over the batch, the outer loss of the moved head."""
    x, y, xv, yv = batch
    feats, feats_v = trainer.model.features(x).detach(), trainer.model.features(xv).detach()
    gamma = trainer.gamma_net(feats)
    w, b = trainer.head.weight, trainer.head.bias
    p_y = torch.softmax(feats @ w.t() + b, dim=1)[torch.arange(len(y)), y]
    per_sample = -((1 - p_y) ** gamma) * torch.log(p_y)
    inner = per_sample.sum() if reduction == "sum" else per_sample.mean()
    gw, gb = torch.autograd.grad(inner, (w, b), create_graph=True)
    logits_v = feats_v @ (w - inner_lr * gw).t() + (b - inner_lr * gb)
    return trainer.outer_loss(logits_v, yv)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_look_ahead_is_one_sgd_step_on_the_summed_or_mean_focal_loss(reduction) -> None:
    trainer, batch = _double_trainer("sece", "head", inner_reduction=reduction)
    expected = _by_hand(trainer, batch, INNER_LR, reduction)
    value, hyper = trainer.hypergradient(*batch, inner_lr=INNER_LR)
    expected_hyper = torch.autograd.grad(expected, list(trainer.gamma_net.parameters()))
    # float64, the same formulas in another order (a sum against B times a mean): rounding
    # of order 1e-15, far inside 1e-9
    torch.testing.assert_close(value, expected.detach(), rtol=1e-9, atol=0)
    for got, want in zip(hyper, expected_hyper, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-15)
    other = "mean" if reduction == "sum" else "sum"  # and the other reduction is far off
    assert abs(_by_hand(trainer, batch, INNER_LR, other).item() - value.item()) > 1e-4


def test_summed_look_ahead_is_the_mean_one_with_a_step_batch_size_times_larger() -> None:
    summed, batch = _double_trainer("dece", "head")
    mean, _ = _double_trainer("dece", "head", inner_reduction="mean")
    value, hyper = summed.hypergradient(*batch, inner_lr=INNER_LR)
    value_mean, hyper_mean = mean.hypergradient(*batch, inner_lr=INNER_LR * len(batch[1]))
    assert torch.equal(value, value_mean)  # the same computation: one product differs in
    for a, b in zip(hyper, hyper_mean, strict=True):  # the order of its two factors only
        assert torch.equal(a, b)


@pytest.mark.parametrize("outer", OUTER_LOSSES)
@pytest.mark.parametrize("dece_form", ["ranked", "sharpened"])
def test_each_outer_loss_is_its_formula(outer, dece_form) -> None:
    trainer, _ = _double_trainer(outer, "head", dece_form=dece_form)
    logits = torch.randn(30, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    labels = torch.randint(0, 3, (30,), generator=torch.Generator().manual_seed(9))
    probs = torch.softmax(logits, dim=1)
    ce = F.cross_entropy(logits, labels)
    smooth = sece(probs, labels, bandwidth=0.2)
    calibration = (dece(probs, labels, form="ranked", **RANKED_DECE) if dece_form == "ranked"
                   else dece(probs, labels))  # the sharpened DECE at its defaults, as before
    expected = {"sece": smooth, "sece+ce": smooth + ce, "dece": calibration,
                "ce+0.5dece": ce + 0.5 * calibration}[outer]
    # the same float64 formulas, composed in the same order
    torch.testing.assert_close(trainer.outer_loss(logits, labels), expected, rtol=1e-12, atol=0)


def test_outer_loss_depends_on_gamma_net_only_through_the_look_ahead() -> None:
    trainer, batch = _double_trainer("sece", "head")
    outer0, without = trainer.hypergradient(*batch, inner_lr=0.5, look_ahead=False)
    assert all(g is None for g in without)  # not even connected to the graph
    outer1, with_ = trainer.hypergradient(*batch, inner_lr=0.5)
    assert all(g is not None and g.abs().max() > 0 for g in with_)
    assert outer0 != outer1  # the look-ahead moved the head


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_two_meta_steps_match_a_hand_written_loop(reduction) -> None:
    """Steps (1)-(4) twice, written out: the mean reduction is the trainer's former (and
    only) behaviour, the sum the reference's."""
    trainer, _ = _double_trainer("sece", "head", inner_reduction=reduction, inner_lr=None,
                                 lr=0.05, momentum=0.9, weight_decay=5e-4, meta_lr=0.01)
    model, gnet = copy.deepcopy(trainer.model), copy.deepcopy(trainer.gamma_net)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    adam = torch.optim.Adam(gnet.parameters(), lr=0.01)
    hand = MetaTrainer(model, gnet, device="cpu", progress=False, epochs=1,
                       sece_bandwidth=0.2)  # only its outer_loss and features are used
    for seed in (1, 2):
        x, y = blobs(24, seed=10 * seed)
        xv, yv = blobs(20, seed=10 * seed + 1)
        batch = (x.double(), y, xv.double(), yv)
        trainer.train_step(*batch)
        outer = _by_hand(hand, batch, 0.05, reduction)  # inner_lr: the backbone's lr
        adam.zero_grad()
        outer.backward()
        adam.step()
        model.zero_grad()  # the outer backward reached the head; the real step starts clean
        feats = model.features(batch[0])
        gamma = gnet(feats.detach()).detach()
        p_y = torch.softmax(model.head(feats), dim=1)[torch.arange(24), y]
        loss = (-((1 - p_y) ** gamma) * torch.log(p_y)).mean()
        sgd.zero_grad()
        loss.backward()
        sgd.step()
    # float64; the same formulas in another order, through two Adam and SGD steps: rounding
    # of order 1e-15 relative, grown by the few operations of two steps, inside 1e-9
    for (name, p), q in zip(trainer.model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=name)
    for (name, p), q in zip(trainer.gamma_net.named_parameters(), gnet.parameters(),
                            strict=True):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12, msg=name)


# --------------------------------------------------------------------------- real step


class ZeroGamma(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.zeros(features.shape[0], dtype=features.dtype, device=features.device)


@pytest.mark.parametrize("grad_clip", [None, 0.05])
def test_real_step_with_zero_gamma_is_a_cross_entropy_step(grad_clip) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    reference = copy.deepcopy(model)
    trainer = MetaTrainer(model, ZeroGamma(), device="cpu", progress=False, epochs=1,
                          lr=0.1, momentum=0.9, weight_decay=5e-4, grad_clip=grad_clip)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for seed in (1, 2):  # two steps: momentum buffers must agree too
        x, y = blobs(16, seed=seed)
        loss, _ = trainer.real_step(x, y)
        ce = F.cross_entropy(reference(x), y)
        opt.zero_grad()
        ce.backward()
        if grad_clip is not None:
            assert nn.utils.clip_grad_norm_(reference.parameters(), grad_clip) > grad_clip
        opt.step()
        torch.testing.assert_close(loss, ce.detach())
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)


class BNNet(TinyNet):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))


def test_look_ahead_leaves_batch_norm_statistics_alone() -> None:
    torch.manual_seed(0)
    model = BNNet()
    trainer = MetaTrainer(model, GammaNet(8), inner_params="all", device="cpu",
                          progress=False, epochs=1)
    before = state(model.body[1])
    x, y = blobs(16, seed=1)
    params = state(model)
    trainer.hypergradient(x, y, x, y, inner_lr=0.1)
    assert_same(state(model.body[1]), before)
    assert_same(state(model), params)  # the virtual step touches no real parameter
    trainer.real_step(x, y)
    assert not torch.equal(model.body[1].running_mean, before["running_mean"])


# --------------------------------------------------------------------------- fit


def test_same_seed_gives_identical_history_and_parameters() -> None:
    runs = []
    for _ in range(2):
        model, gnet = make_pair()
        trainer = MetaTrainer(model, gnet, **KW)
        history = trainer.fit(*make_loaders())
        runs.append((history.without_timing(), state(model), state(gnet)))
    assert runs[0][0] == runs[1][0]
    assert_same(runs[0][1], runs[1][1])
    assert_same(runs[0][2], runs[1][2])
    record = runs[0][0][-1]
    for key in ("train_loss", "train_acc", "val_loss", "val_ece", "val_acc", "outer_loss",
                "gamma_mean", "gamma_std"):
        assert key in record


def _loaders(with_meta: bool) -> tuple:
    train, val = make_loaders()
    return (train, val, None, make_meta_loader()) if with_meta else (train, val)


@pytest.mark.parametrize("with_meta", [False, True])
def test_resume_after_exception_is_exact(tmp_path: Path, with_meta: bool) -> None:
    model, gnet = make_pair()
    full = MetaTrainer(model, gnet, **KW)
    expected = full.fit(*_loaders(with_meta))

    class Interrupt(Exception):
        pass

    def crash(epoch, trainer, record):
        if epoch == 3:  # the epoch-2 checkpoint is on disk
            raise Interrupt

    model, gnet = make_pair()
    with pytest.raises(Interrupt):
        MetaTrainer(model, gnet, checkpoint_dir=tmp_path, epoch_callback=crash, **KW).fit(
            *_loaders(with_meta))
    saved = torch.load(tmp_path / "last.pt", weights_only=True)
    assert saved["epoch"] == 2
    assert saved["meta_position"] != 0  # the meta batches are mid-cycle: 10 batches of 3
    torch.manual_seed(12345)  # disturb the global RNG: the checkpoint must restore it

    model, gnet = make_pair(seed=99)
    resumed = MetaTrainer(model, gnet, checkpoint_dir=tmp_path, **KW)
    history = resumed.fit(*_loaders(with_meta))
    assert history.without_timing() == expected.without_timing()
    assert_same(state(resumed.model), state(full.model))
    assert_same(state(resumed.gamma_net), state(full.gamma_net))
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]

    model, gnet = make_pair()
    with pytest.raises(ValueError, match="meta_lr"):
        MetaTrainer(model, gnet, checkpoint_dir=tmp_path, **{**KW, "meta_lr": 0.5}).fit(
            *_loaders(with_meta))


def test_outer_batches_come_from_the_meta_loader_and_reshuffle_per_pass() -> None:
    model, gnet = make_pair()
    train, val = make_loaders()
    meta = make_meta_loader()
    MetaTrainer(model, gnet, **KW).fit(train, val, meta_loader=meta)
    assert meta.yielded == 3 * 5  # one batch per training step: 3 epochs of 5 steps
    assert val.yielded == 3 * 3  # the validation pass of each epoch, nothing else
    assert meta.epochs_set == [0, 1, 2, 3, 4]  # a new order for each of its 5 passes
    assert val.epochs_set == []
    # without a meta loader the validation batches double as outer batches, as before
    model, gnet = make_pair()
    train, val = make_loaders()
    MetaTrainer(model, gnet, **KW).fit(train, val)
    assert val.yielded == 3 * 5 + 3 * 3 and val.epochs_set == []


def test_meta_loader_changes_the_run_and_needs_no_validation_loader() -> None:
    runs = {}
    for name, args in {"val": make_loaders(), "meta": (*make_loaders(), None,
                                                      make_meta_loader())}.items():
        model, gnet = make_pair()
        runs[name] = (MetaTrainer(model, gnet, **KW).fit(*args), state(gnet))
    assert not torch.equal(runs["val"][1]["W"], runs["meta"][1]["W"])
    assert runs["val"][0]["outer_loss"] != runs["meta"][0]["outer_loss"]
    model, gnet = make_pair()
    train, _ = make_loaders()
    history = MetaTrainer(model, gnet, **KW).fit(train, None, meta_loader=make_meta_loader())
    assert "val_loss" not in history.columns and history["gamma_mean"][-1] > 0


def test_small_real_run_on_digits_learns_and_records_gamma() -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    x, y = x[perm], y[perm]
    train = ListLoader(x[:1200], y[:1200], 64, shuffle=True)
    val = ListLoader(x[1200:1500], y[1200:1500], 100)
    test = ListLoader(x[1500:], y[1500:], 100)
    torch.manual_seed(0)
    model = TinyNet(d_in=64, d=32, classes=10)
    trainer = MetaTrainer(model, GammaNet(32), epochs=6, lr=0.1, device="cpu", progress=False)
    history = trainer.fit(train, val, test)
    assert len(history) == 6
    assert history["val_acc"][-1] > 0.8  # chance is 0.1
    assert all(g > 0 for g in history["gamma_mean"])
    assert all(s >= 0 for s in history["gamma_std"])
    assert history["gamma_std"][-1] > 0  # gamma varies across samples
    gamma = trainer.predict_gamma(test)
    assert gamma.shape == (297,)
    assert abs(gamma.mean().item() - history["gamma_mean"][-1]) < 1e-6


def test_without_a_test_loader_gamma_comes_from_the_validation_forward() -> None:
    model, gnet = make_pair()
    trainer = MetaTrainer(model, gnet, **KW)
    train, val = make_loaders()
    history = trainer.fit(train, val)
    gamma = trainer.predict_gamma(val)
    assert history["gamma_mean"][-1] == pytest.approx(gamma.mean().item(), rel=1e-6)
    assert history["gamma_std"][-1] == pytest.approx(gamma.std(correction=0).item(), rel=1e-5)
    # the one-pass validation gives the same metrics as the Trainer's own
    plain = Trainer.validate(trainer, val)
    for key, value in plain.items():
        assert history[key][-1] == pytest.approx(value, rel=1e-6, abs=1e-9), key


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"in_features": 0}, ValueError, "in_features"),
    ({"in_features": 2.5}, TypeError, "in_features"),
    ({"in_features": 4, "heads": 0}, ValueError, "heads"),
    ({"in_features": 4, "tau": 0.0}, ValueError, "tau"),
])
def test_gamma_net_argument_errors_name_the_argument(kwargs, error, name) -> None:
    with pytest.raises(error, match=name):
        GammaNet(**kwargs)


def test_gamma_net_input_errors() -> None:
    net = GammaNet(4)
    with pytest.raises(ValueError, match="features"):
        net(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="features"):
        net(torch.zeros(3, 4, dtype=torch.int64))
    with pytest.raises(TypeError, match="features"):
        net([[0.0] * 4])


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"outer": "ece"}, ValueError, "outer"),
    ({"inner_params": "body"}, ValueError, "inner_params"),
    ({"inner_reduction": "total"}, ValueError, "inner_reduction"),
    ({"inner_reduction": None}, ValueError, "inner_reduction"),
    ({"dece_form": "gaussian"}, ValueError, "dece_form"),
    ({"outer": "ce+dece"}, ValueError, "outer"),
    ({"inner_lr": -1.0}, ValueError, "inner_lr"),
    ({"lr": 0}, ValueError, "lr"),
    ({"momentum": 1.0}, ValueError, "momentum"),
    ({"weight_decay": -1}, ValueError, "weight_decay"),
    ({"meta_lr": 0.0}, ValueError, "meta_lr"),
    ({"schedule": "linear"}, ValueError, "schedule"),
    ({"epochs": 0}, ValueError, "epochs"),
    ({"seed": -1}, ValueError, "seed"),
    ({"sece_bandwidth": 0}, ValueError, "sece_bandwidth"),
    ({"amp": 1}, TypeError, "amp"),
    ({"epoch_callback": 3}, TypeError, "epoch_callback"),
    ({"device": "tpu"}, ValueError, "device"),
])
def test_meta_trainer_argument_errors_name_the_argument(kwargs, error, name) -> None:
    model, gnet = make_pair()
    with pytest.raises(error, match=name):
        MetaTrainer(model, gnet, **{"device": "cpu", **kwargs})


def test_meta_trainer_rejects_bad_models_and_loaders() -> None:
    _, gnet = make_pair()
    with pytest.raises(TypeError, match="model"):
        MetaTrainer("net", gnet, device="cpu")
    with pytest.raises(ValueError, match="head"):
        MetaTrainer(nn.Linear(3, 2), gnet, device="cpu")
    with pytest.raises(TypeError, match="gamma_net"):
        MetaTrainer(TinyNet(), lambda f: f, device="cpu")
    trainer = MetaTrainer(TinyNet(), gnet, device="cpu", progress=False, epochs=1)
    train, val = make_loaders()
    with pytest.raises(ValueError, match="val_loader"):
        trainer.fit(train, None)
    with pytest.raises(ValueError, match="val_loader"):
        trainer.fit(train, [])


def test_amp_on_cpu_is_bfloat16_autocast_and_auto_stays_float32_outside_the_pilot() -> None:
    model, gnet = make_pair()
    assert MetaTrainer(model, gnet, amp=True, device="cpu").amp is True
    model, gnet = make_pair()
    assert MetaTrainer(model, gnet, device="cpu").amp is False  # no regime: float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_amp_run() -> None:
    model, gnet = make_pair()
    trainer = MetaTrainer(model, gnet, **{**KW, "device": "cuda", "epochs": 2}, amp=True)
    history = trainer.fit(*make_loaders())
    assert next(trainer.model.parameters()).is_cuda
    assert all(g > 0 for g in history["gamma_mean"])
    assert all(torch.isfinite(torch.tensor(v)) for v in history["outer_loss"])


# --------------------------------------------------------------------------- Meta-Calibration


def _double_l2_trainer(outer: str, **options) -> tuple[MetaCalibrationTrainer, tuple]:
    """A float64 Meta-Calibration trainer whose coefficients are away from 0 (at 0 the
    penalty's look-ahead gradient is still non-zero, but a test at a generic point is
    stronger)."""
    torch.manual_seed(4)
    model = TinyNet().double()
    trainer = MetaCalibrationTrainer(model, outer=outer, device="cpu", progress=False,
                                     epochs=1, **options)
    with torch.no_grad():
        for coef in trainer.l2.parameters():
            coef.copy_(0.5 * torch.randn_like(coef))
    x, y = blobs(24, seed=5)
    xv, yv = blobs(20, seed=6)
    return trainer, (x.double(), y, xv.double(), yv)


def test_learnable_l2_starts_at_zero_and_penalizes_each_head_parameter() -> None:
    head = nn.Linear(5, 3)
    l2 = LearnableL2(head)
    assert [n for n, _ in l2.named_parameters()] == ["weight", "bias"]
    assert all(torch.equal(c, torch.zeros_like(p))
               for c, p in zip(l2.parameters(), head.parameters(), strict=True))
    with torch.no_grad():
        l2.weight.fill_(2.0)
        l2.bias.copy_(torch.tensor([1.0, -1.0, 0.5]))
    params = dict(head.named_parameters())
    expected = (2.0 * head.weight**2).sum() + (l2.bias * head.bias**2).sum()
    torch.testing.assert_close(l2.penalty(params), expected, rtol=1e-6, atol=0)
    with pytest.raises(TypeError, match="head"):
        LearnableL2(nn.Conv2d(1, 1, 1))


@pytest.mark.parametrize(("outer", "options"), [
    ("dece", {}),
    ("ce+0.5dece", {}),
    ("dece", {"inner_reduction": "mean"}),
])
def test_meta_calibration_hypergradient_matches_central_differences(outer, options) -> None:
    trainer, batch = _double_l2_trainer(outer, **options)
    _, hyper = trainer.hypergradient(*batch, inner_lr=INNER_LR)
    eps = 1e-6
    for coef, grad in zip(trainer.l2.parameters(), hyper, strict=True):
        assert grad is not None
        numeric = torch.zeros_like(coef)
        flat = coef.data.view(-1)
        for i in range(flat.numel()):
            old = flat[i].item()
            flat[i] = old + eps
            up = trainer.hypergradient(*batch, inner_lr=INNER_LR)[0].item()
            flat[i] = old - eps
            down = trainer.hypergradient(*batch, inner_lr=INNER_LR)[0].item()
            flat[i] = old
            numeric.view(-1)[i] = (up - down) / (2 * eps)
        assert numeric.abs().max() > 1e-8  # the check is not vacuous
        # float64 central differences, as for gamma-Net above
        torch.testing.assert_close(grad, numeric, rtol=1e-4, atol=1e-8)


def test_meta_calibration_look_ahead_steps_on_the_summed_loss_plus_penalty() -> None:
    trainer, (x, y, xv, yv) = _double_l2_trainer("dece")
    feats, feats_v = trainer.model.features(x).detach(), trainer.model.features(xv).detach()
    w, b = trainer.head.weight, trainer.head.bias
    summed = (F.cross_entropy(feats @ w.t() + b, y, reduction="sum")
              + (trainer.l2.weight * w**2).sum() + (trainer.l2.bias * b**2).sum())
    gw, gb = torch.autograd.grad(summed, (w, b), create_graph=True)
    expected = trainer.outer_loss(feats_v @ (w - INNER_LR * gw).t() + (b - INNER_LR * gb), yv)
    value, hyper = trainer.hypergradient(x, y, xv, yv, inner_lr=INNER_LR)
    want = torch.autograd.grad(expected, list(trainer.l2.parameters()))
    # float64, the same terms in another order (a mean times B against a sum): ~1e-15
    torch.testing.assert_close(value, expected.detach(), rtol=1e-9, atol=0)
    for got, ref in zip(hyper, want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-15)


def test_meta_calibration_real_step_descends_ce_plus_the_fixed_penalty() -> None:
    torch.manual_seed(0)
    model = TinyNet()
    reference = copy.deepcopy(model)
    trainer = MetaCalibrationTrainer(model, device="cpu", progress=False, epochs=1, lr=0.1,
                                     momentum=0.9, weight_decay=5e-4)
    with torch.no_grad():
        trainer.l2.weight.fill_(3.0)
        trainer.l2.bias.fill_(-1.0)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for seed in (1, 2):
        x, y = blobs(16, seed=seed)
        loss, _ = trainer.real_step(x, y)
        penalty = 3.0 * (reference.head.weight**2).sum() - (reference.head.bias**2).sum()
        want = F.cross_entropy(reference(x), y) + penalty / 16
        opt.zero_grad()
        want.backward()
        opt.step()
        # the same float32 formula, terms summed in another order: a few ulps
        torch.testing.assert_close(loss, want.detach(), rtol=1e-6, atol=1e-7)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    assert all(c.grad is None for c in trainer.l2.parameters())  # the real step leaves them


def test_meta_calibration_fit_learns_coefficients_and_records_them() -> None:
    torch.manual_seed(0)
    trainer = MetaCalibrationTrainer(TinyNet(), **{**KW, "meta_lr": 0.05})
    train, val = make_loaders()
    history = trainer.fit(train, val, meta_loader=make_meta_loader())
    assert "gamma_mean" not in history.columns
    assert history["l2_mean"][-1] == pytest.approx(
        float(torch.cat([c.detach().flatten() for c in trainer.l2.parameters()]).mean()))
    assert history["l2_std"][-1] > 0  # the coefficients left 0, each its own way
    assert trainer.fingerprint()["trainer"] == "meta-calibration"
    with pytest.raises(ValueError, match="inner_params"):
        MetaCalibrationTrainer(TinyNet(), inner_params="all", device="cpu")
    with pytest.raises(ValueError, match="head"):
        MetaCalibrationTrainer(nn.Linear(4, 3), device="cpu")
