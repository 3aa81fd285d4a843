"""The fast path: its policy, the float32 path kept bit for bit, config hashes, provenance
and the pilot's equivalence test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from calnotes.runs import experiment
from calnotes.runs.store import RunStore, config_hash
from calnotes.training import (
    History,
    MetaTrainer,
    MixupTrainer,
    Trainer,
    bf16_capable,
    cpu_features,
    predict_logits,
    regime_key,
    resolve_fast_path,
)
from calnotes.training import fast_path as fp
from calnotes.training.meta import GammaNet
from calnotes.training.pilot import equivalence_row, margin_from_sd, run_measures

RESULTS = Path(__file__).resolve().parent.parent / "results"
CPU = torch.device("cpu")


class ConvNet(nn.Module):
    """Conv + batch norm + dropout, with ``features`` and a linear ``head``."""

    def __init__(self, batch_norm: bool = True) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4) if batch_norm else nn.Identity(),
            nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.2))
        self.head = nn.Linear(16, 3)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def batches(n: int = 48, size: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    return [(x[i:i + size], y[i:i + size]) for i in range(0, n, size)]


def model(seed: int = 0, batch_norm: bool = True) -> ConvNet:
    torch.manual_seed(seed)
    return ConvNet(batch_norm)


# --------------------------------------------------------------------------- policy


def test_settings_are_auto_true_or_false() -> None:
    assert fp.check_setting(None, "x") == "auto" and fp.check_setting("auto", "x") == "auto"
    assert fp.check_setting(True, "x") is True and fp.check_setting(False, "x") is False
    for bad in (1, 0, "yes", 1.0):
        with pytest.raises(TypeError, match="compile"):
            fp.check_setting(bad, "compile")


def test_auto_is_float32_until_the_regime_passed_its_pilot(monkeypatch) -> None:
    net = model()
    regime = "fashion_mnist/resnet14/ce"
    path = resolve_fast_path("auto", "auto", "auto", device=CPU, model=net, regime=regime,
                             capable=True)
    assert (path.amp, path.channels_last, path.compile) == (False, False, False)
    monkeypatch.setattr(fp, "PILOT_PASSED", frozenset({regime}))
    path = resolve_fast_path("auto", "auto", "auto", device=CPU, model=net, regime=regime,
                             capable=True)
    assert (path.amp, path.channels_last, path.compile) == (True, True, False)
    assert path.precision == "bfloat16-autocast" and path.layout == "channels_last"
    # a CPU without bf16 instructions, another regime, or no regime: float32
    for capable, reg in [(False, regime), (True, "fashion_mnist/resnet20/ce"), (True, None)]:
        path = resolve_fast_path("auto", "auto", "auto", device=CPU, model=net, regime=reg,
                                 capable=capable)
        assert not path.amp and not path.channels_last


def test_auto_layout_in_float32_is_the_old_policy() -> None:
    # convolutions without batch norm: NHWC; with batch norm: NCHW
    assert resolve_fast_path("auto", "auto", False, device=CPU, model=model(batch_norm=False),
                             capable=False).channels_last
    assert not resolve_fast_path("auto", None, False, device=CPU, model=model(),
                                 capable=False).channels_last
    forced = resolve_fast_path(True, False, True, device=CPU, model=model(), capable=False)
    assert (forced.amp, forced.channels_last, forced.compile) == (True, False, True)


def test_regime_key_names_data_network_and_objective() -> None:
    cfg = experiment.default_config(model="resnet14", model_options={"width": 16,
                                                                    "batch_norm": True})
    assert regime_key(cfg) == 'fashion_mnist/resnet14{"batch_norm":true,"width":16}/ce'
    meta = experiment.default_config(model="resnet14", loss="focal",
                                     meta={"outer": "sece"})
    assert regime_key(meta) == "fashion_mnist/resnet14/meta-gamma-net-sece"
    assert regime_key(experiment.default_config(loss="mixup")) == "fashion_mnist/lenet5/mixup"
    assert regime_key(None) is None
    with pytest.raises(TypeError, match="run_config"):
        regime_key(["resnet14"])


def test_cpu_features_read_the_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\n"
                    "flags\t\t: fpu sse2 avx512f avx512_bf16\n\nprocessor\t: 1\n"
                    "model name\t: other\nflags\t\t: fpu amx_bf16\n")
    features = cpu_features(info)
    assert features["cpu_model"] == "Test CPU 9000"
    assert features["avx512_bf16"] is True and features["amx_bf16"] is False
    assert features["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert bf16_capable({**features, "torch_cpu_capability": "AVX512"})
    assert not bf16_capable({**features, "torch_cpu_capability": "DEFAULT"})
    assert not bf16_capable({**features, "avx512_bf16": False, "torch_cpu_capability": "AVX512"})
    missing = cpu_features(tmp_path / "absent")
    assert missing["amx_bf16"] is False and missing["avx512_bf16"] is False


def test_compile_cache_is_per_architecture(tmp_path: Path) -> None:
    assert fp.compile_cache_dir("resnet14", tmp_path) == tmp_path / "resnet14"
    assert fp.compile_cache_dir("a/b c", tmp_path) == tmp_path / "a_b_c"
    with pytest.raises(ValueError, match="architecture"):
        fp.compile_cache_dir("", tmp_path)


# --------------------------------------------------------------------------- float32 path


def hand_loop(net: nn.Module, data, epochs: int, seed: int) -> list[float]:
    """Plain float32 SGD (momentum, weight decay, cosine), written out independently."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
    torch.manual_seed(seed)
    losses = []
    for _ in range(epochs):
        net.train()
        total, seen = torch.zeros((), dtype=torch.float64), 0
        for x, y in data:
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach().double() * y.shape[0]
            seen += y.shape[0]
        losses.append(float(total) / seen)
        sched.step()
    return losses


@pytest.mark.parametrize("settings", [dict(amp=False, channels_last=False, compile=False), {}])
def test_float32_path_is_a_plain_float32_loop_bit_for_bit(settings) -> None:
    """False everywhere, and the default outside a passed regime, compute exactly what a
    plain float32 NCHW loop computes: same losses, same parameters (same kernels, so no
    tolerance is needed)."""
    data = batches()
    trainer = Trainer(model(), epochs=3, device="cpu", progress=False, threads=1, seed=5,
                      **settings)
    assert trainer.fast_path.precision == "float32" and not trainer.channels_last
    history = trainer.fit(data)
    ref = model()
    with torch.random.fork_rng():
        torch.set_num_threads(1)
        losses = hand_loop(ref, data, 3, seed=5)
    assert history["train_loss"] == losses
    for a, b in zip(trainer.model.state_dict().values(), ref.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_bfloat16_path_stores_float32_logits_and_records_its_setting() -> None:
    data = batches()
    for cls, extra in [(Trainer, {}), (MixupTrainer, {})]:
        trainer = cls(model(), epochs=1, device="cpu", progress=False, amp=True,
                      channels_last=True, **extra)
        history = trainer.fit(data, data)
        assert trainer.fast_path.as_provenance()["precision"] == "bfloat16-autocast"
        assert np.isfinite(history["val_loss"][0])
        logits, _ = predict_logits(trainer.model, data)
        assert logits.dtype == torch.float32
    net = model()
    meta = MetaTrainer(net, GammaNet(16, heads=2), epochs=1, device="cpu", progress=False,
                       amp=True, channels_last=True)
    history = meta.fit(data, data, data)
    assert meta.amp and meta.channels_last and np.isfinite(history["gamma_mean"][0])
    assert meta.predict_gamma(data).dtype == torch.float32


# --------------------------------------------------------------------------- configs


def test_stored_runs_keep_their_hash() -> None:
    configs = sorted(RESULTS.glob("*/config.json"))
    if not configs:
        pytest.skip("no stored runs in results/")
    for path in configs:
        config = json.loads(path.read_text())
        if "dataset" not in config:
            continue  # not a run entry
        assert config_hash(config) == path.parent.name, path
        if "fast_path" not in config:  # "auto" is the key's absence
            assert config_hash({**config, "fast_path": "auto"}) == path.parent.name, path


def test_fast_path_key_is_part_of_the_run_only_when_set() -> None:
    base = experiment.default_config(model="resnet8")
    assert "fast_path" not in base
    assert experiment.default_config(model="resnet8", fast_path=None) == base
    on, off = (config_hash({**base, "fast_path": v}) for v in (True, False))
    assert len({on, off, config_hash(base)}) == 3
    with pytest.raises(TypeError, match="fast_path"):
        experiment.default_config(fast_path="bf16")


def test_make_trainer_follows_the_config() -> None:
    cfg = experiment.default_config(model="resnet8")
    for value, amp, layout in [(True, True, True), (False, False, False)]:
        trainer = experiment.make_trainer({**cfg, "fast_path": value}, model(), device="cpu",
                                          progress=False)
        assert (trainer.amp, trainer.channels_last) == (amp, layout)
    trainer = experiment.make_trainer(cfg, model(), device="cpu", progress=False)
    assert trainer.fast_path.requested == ("auto", "auto", "auto")


def test_provenance_records_cpu_and_fast_path(tmp_path: Path) -> None:
    cfg = experiment.default_config(model="resnet8", fast_path=True)
    logits = torch.zeros(4, 3)
    labels = torch.tensor([0, 1, 2, 0])
    setting = resolve_fast_path(True, True, False, device=CPU, model=model()).as_provenance()
    result = experiment.RunResult(
        config=cfg, history=History([{"epoch": 1, "seconds": 1.0}]), val_logits=None,
        val_labels=None, test_logits=logits, test_labels=labels, metrics={}, seconds=1.0,
        device="cpu", threads=1, fast_path=setting)
    store = RunStore(tmp_path)
    store.save(result, label="test")
    provenance = store.load(cfg).provenance
    assert set(provenance["cpu"]) == {"cpu_model", "torch_cpu_capability", "amx_bf16",
                                      "avx512_bf16"}
    assert provenance["cpu"]["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert provenance["fast_path"]["precision"] == "bfloat16-autocast"
    assert provenance["fast_path"]["layout"] == "channels_last"
    assert provenance["fast_path"]["compile"] is False


# --------------------------------------------------------------------------- pilot


def test_run_measures_hand_case() -> None:
    logits = torch.log(torch.tensor([[0.8, 0.2], [0.4, 0.6]]))
    labels = torch.tensor([0, 0])
    history = {"records": [{"gamma_mean": 1.0}, {"gamma_mean": 2.0}]}
    m = run_measures(logits, labels, history)
    assert m["error"] == pytest.approx(0.5)
    assert m["nll"] == pytest.approx(-(np.log(0.8) + np.log(0.4)) / 2)
    # two bins hold one sample each: |0.8 - 1| and |0.6 - 0|, weighted 1/2
    assert m["ece"] == pytest.approx((0.2 + 0.6) / 2)
    assert m["gamma_trajectory"] == pytest.approx(1.5)
    assert "gamma_trajectory" not in run_measures(logits, labels, {"records": [{}]})


def test_equivalence_row_hand_case() -> None:
    # differences 0.1, 0.2, 0.3: mean 0.2, sd 0.1, se 0.1 / sqrt(3); t(0.95, 2) = 2.919986
    base = [1.0, 2.0, 3.0]
    fast = [1.1, 2.2, 3.3]
    row = equivalence_row(fast, base, margin=0.5)
    half = 2.919986 * 0.1 / np.sqrt(3)
    assert row["difference"] == pytest.approx(0.2)
    assert row["sd_difference"] == pytest.approx(0.1)
    assert (row["low"], row["high"]) == pytest.approx((0.2 - half, 0.2 + half), rel=1e-5)
    assert row["equivalent"] is True
    assert equivalence_row(fast, base, margin=0.3)["equivalent"] is False  # 0.369 > 0.3
    assert equivalence_row(fast, base, margin=0.3)["p_upper"] > 0.05
    with pytest.raises(ValueError, match="margin"):
        equivalence_row(fast, base, margin=0.0)
    assert margin_from_sd([1.0, 2.0, 3.0], 0.5) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="values"):
        margin_from_sd([1.0], 0.5)


class FakeRun:
    def __init__(self, shift: float, gamma: float) -> None:
        self.test_logits = torch.tensor([[2.0 + shift, 0.0], [0.0, 1.0 - shift], [1.0, 0.5]])
        self.test_labels = torch.tensor([0, 1, 1])
        self.history = History([{"gamma_mean": gamma}, {"gamma_mean": gamma + 1}])


def declaration(tmp_path: Path) -> Path:
    path = tmp_path / "pilot.yaml"
    path.write_text(
        "label: p\nseeds: [7, 8, 9]\nalpha: 0.05\nmargin_fraction: 0.5\n"
        "arms: {float32: {fast_path: false}, fast: {fast_path: true}}\n"
        "regimes:\n  r:\n    config: {model: resnet8}\n"
        "    measures: [error, nll, gamma_trajectory]\n"
        "    margins: {error: 0.5, nll: 0.5, gamma_trajectory: 0.01}\n")
    return path


def test_pilot_table_pairs_seeds_and_requires_every_measure(tmp_path: Path) -> None:
    from calnotes.training.pilot import load_declaration, pilot_configs, pilot_table

    decl = load_declaration(declaration(tmp_path))
    order = pilot_configs(decl)
    assert [(s, a) for _, s, a, _ in order] == [(7, "float32"), (7, "fast"), (8, "float32"),
                                                (8, "fast"), (9, "float32"), (9, "fast")]
    assert order[1][3] == {"model": "resnet8", "seed": 7, "fast_path": True}
    shifts = {(7, False): 0.0, (7, True): 0.01, (8, False): 0.1, (8, True): 0.12,
              (9, False): 0.2, (9, True): 0.19}

    def load(cfg):  # the fast arm's gamma is 0.02 higher: beyond its margin 0.01
        return FakeRun(shifts[cfg["seed"], cfg["fast_path"]], 0.02 * cfg["fast_path"])

    rows = {r["measure"]: r for r in pilot_table(decl, load)}
    assert rows["error"]["n"] == 3 and rows["error"]["difference"] == 0.0
    assert rows["nll"]["equivalent"] and rows["error"]["equivalent"]
    assert not rows["gamma_trajectory"]["equivalent"]
    assert rows["gamma_trajectory"]["difference"] == pytest.approx(0.02)
    assert not any(r["passes"] for r in rows.values())  # one measure fails: the regime fails
    # a seed without both runs: that seed is left out and the regime cannot pass
    partial = pilot_table(decl, lambda cfg: None if cfg["seed"] == 9 else load(cfg))
    assert all(r["n"] == 2 and not r["passes"] for r in partial)
    single = pilot_table(decl, lambda cfg: load(cfg) if cfg["seed"] == 7 else None)
    gamma = {r["measure"]: r for r in single}["gamma_trajectory"]
    assert gamma["n"] == 1 and gamma["difference"] == pytest.approx(0.02)
    assert np.isnan(gamma["low"]) and not gamma["equivalent"]


def test_declaration_is_checked(tmp_path: Path) -> None:
    from calnotes.training.pilot import load_declaration

    path = tmp_path / "bad.yaml"
    path.write_text("label: p\nseeds: [1]\n")
    with pytest.raises(ValueError, match="lacks"):
        load_declaration(path)
    good = declaration(tmp_path).read_text()
    path.write_text(good.replace("gamma_trajectory: 0.01", "ece: 0.01"))
    with pytest.raises(ValueError, match="margin"):
        load_declaration(path)
    repo = Path(__file__).resolve().parent.parent / "benchmarks" / "fast_path_pilot.yaml"
    decl = load_declaration(repo)
    assert decl["seeds"] == [300, 301, 302] and decl["alpha"] == 0.05
