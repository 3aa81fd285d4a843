"""Chapter 4's measures and selection rules: constructed cases and a stored run recomputed."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calnotes.book.evidence import ch04

ROOT = Path(__file__).resolve().parents[1]


def fake_run(history=None, val_logits=None, val_labels=None, name="fake"):
    return SimpleNamespace(history=history or {}, val_logits=val_logits, val_labels=val_labels,
                           path=Path(name))


def test_log_norm_slope_recovers_an_exponential_growth_rate():
    rate = 0.03
    norms = 5.0 * np.exp(rate * np.arange(30))
    assert ch04.log_norm_slope(fake_run({"val_logit_norm": list(norms)})) == pytest.approx(
        rate, rel=1e-9)  # float64 polyfit of exact logs: rounding only
    flat_then_up = [10.0] * 10 + [10.0 * 1.1 ** k for k in range(1, 11)]
    assert ch04.log_norm_slope(fake_run({"val_logit_norm": flat_then_up})) > 0


def test_log_norm_slope_rejects_index_and_bad_histories():
    run = fake_run({"val_logit_norm": [1.0, 2.0]})
    with pytest.raises(ValueError, match="index"):
        ch04.log_norm_slope(run, index=[0])
    with pytest.raises(ValueError, match="val_logit_norm"):
        ch04.log_norm_slope(fake_run({"val_logit_norm": [1.0]}))
    with pytest.raises(ValueError, match="val_logit_norm"):
        ch04.log_norm_slope(fake_run({"val_logit_norm": [1.0, 0.0]}))


def test_own_lr_takes_the_best_validation_accuracy_and_the_larger_rate_on_ties():
    pilot = {lr: fake_run({"val_acc": [0.1, acc]})
             for lr, acc in [(0.1, 0.5), (0.05, 0.8), (0.01, 0.8), (0.005, 0.7)]}
    assert ch04.own_lr(pilot) == 0.05
    with pytest.raises(ValueError, match="pilot"):
        ch04.own_lr({})


def test_val_confidence_gap_matches_a_hand_computed_case():
    logits = torch.tensor([[math.log(3.0), 0.0], [0.0, math.log(3.0)]])  # confidence 0.75 each
    run = fake_run(val_logits=logits, val_labels=torch.tensor([0, 0]))  # accuracy 0.5
    # the logits are float32: log(3) is rounded to 24 bits, the softmax to about 1e-8
    assert ch04.val_confidence_gap(run) == pytest.approx(0.25, abs=1e-7)


def test_choose_regime_takes_the_first_qualifying_candidate():
    confident = (torch.tensor([[5.0, 0.0], [5.0, 0.0]]), torch.tensor([0, 1]))
    modest = (torch.tensor([[0.1, 0.0], [0.1, 0.0]]), torch.tensor([0, 0]))
    shrinking = fake_run({"val_logit_norm": [3.0, 2.0, 1.0]}, *confident)
    growing_modest = fake_run({"val_logit_norm": [1.0, 2.0, 3.0]}, *modest)
    growing_confident = fake_run({"val_logit_norm": [1.0, 2.0, 3.0]}, *confident)
    assert ch04.choose_regime([shrinking, growing_modest, growing_confident]) == 2
    # none qualifies: the largest validation confidence gap
    assert ch04.choose_regime([growing_modest, shrinking]) == 1


def test_lenet_config_is_the_stored_official_recipe():
    from calnotes.runs.store import config_hash

    # LeNet-5, cross-entropy, rate 0.005, seed 0: the chapter's earlier run of this recipe
    assert config_hash(ch04.lenet_config("ce", None, 0, 0.005)) == "35f083256173"


def _fpr95(s_in, s_out):
    """Independent FPR95: the smallest ID score among the top 95% as the threshold."""
    s = np.sort(np.asarray(s_in))[::-1]
    t = s[int(np.ceil(0.95 * len(s))) - 1]
    return float(np.mean(np.asarray(s_out) >= t))


@pytest.mark.skipif(not (ROOT / "results" / "b4b74733c68c").is_dir(), reason="stored run absent")
def test_ood_measure_recomputes_from_stored_logits():
    import json

    from calnotes.runs.ood import run_ood_logits
    from calnotes.runs.store import RunStore

    folder = ROOT / "results" / "b4b74733c68c"  # ResNet-8, LogitNorm, seed 0
    run = RunStore(ROOT / "results").load(json.loads((folder / "config.json").read_text()))
    got = ch04.ood_measure(run, sets="natural", score="msp")
    out = run_ood_logits(run, ch04.ood_pool("fashion_mnist", "natural"), device="cpu")
    msp_in = torch.softmax(run.test_logits.double(), 1).max(1).values.numpy()
    values = []
    for d in range(ch04.N_DRAWS):
        per_set = []
        gen = torch.Generator().manual_seed(d)  # one generator per draw, through the sets in order
        for x in out.values():
            idx = torch.randperm(len(x), generator=gen)[:ch04.N_DRAW] if len(x) > ch04.N_DRAW \
                else torch.arange(len(x))
            per_set.append(_fpr95(msp_in, torch.softmax(x[idx].double(), 1).max(1).values))
        values.append(np.mean(per_set))
    # same float64 scores and the same threshold rule; only ties at the threshold could
    # differ, at most one OOD image in 2,000 per set and draw
    assert got == pytest.approx(float(np.mean(values)), abs=1 / ch04.N_DRAW)
    # the subset of all test rows is the whole set
    assert ch04.ood_measure(run, index=np.arange(len(run.test_labels))) == got


def test_ood_confidence_is_the_mean_msp_of_each_stored_ood_set():
    import json

    from calnotes.runs.store import RunStore

    folder = ROOT / "results" / "b4b74733c68c"  # ResNet-8, LogitNorm, seed 0
    run = RunStore(ROOT / "results").load(json.loads((folder / "config.json").read_text()))
    got = ch04.ood_confidence(run)
    # read the stored float32 logits of each natural set directly, numpy softmax in float64
    import calnotes.runs.ood as ood_runs
    out = ood_runs.run_ood_logits(run, ch04.ood_pool("fashion_mnist", "natural"), device="cpu")
    means = []
    for x in out.values():
        z = x.numpy().astype(np.float64)
        e = np.exp(z - z.max(1, keepdims=True))
        means.append(float((e / e.sum(1, keepdims=True)).max(1).mean()))
    assert len(means) == len(ch04.NATURAL_SETS["fashion_mnist"])
    # float64 softmax both ways: only the order of summation differs
    assert got == pytest.approx(float(np.mean(means)), abs=1e-12)
    assert 0.1 <= got <= 1.0  # a max softmax of 10 classes
    with pytest.raises(ValueError, match="index"):
        ch04.ood_confidence(run, index=[0, 1])


def test_ood_pool_rejects_unknown_names():
    with pytest.raises(ValueError, match="kind"):
        ch04.ood_pool("fashion_mnist", "textures")
    with pytest.raises(ValueError, match="dataset"):
        ch04.ood_pool("cifar10", "natural")



def test_compute_runs_without_training_trains_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CALNOTES_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("CALNOTES_CHECKPOINTS", str(tmp_path / "checkpoints"))
    from calnotes.runs.store import RunNotFound

    with pytest.raises(RunNotFound):  # the first pilot is not stored, and is not trained
        ch04.compute_runs(train=False)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    assert not (tmp_path / "checkpoints").exists()
    with pytest.raises(TypeError, match="train"):
        ch04.compute_runs(train="no")


# --- the exercises' solutions


def test_normalised_scores_hand_computed():
    # ID: confident in a direction; OOD: same direction, longer, and a near-uniform one
    test_logits = torch.tensor([[3.0, 0.0], [0.0, 3.0]])
    ood_logits = {"far": torch.tensor([[1.0, 1.0], [1.1, 0.9]])}
    table = ch04.normalised_score_table(test_logits, ood_logits, tau=0.5)
    # max cosine: ID rows 1.0; OOD rows 1/sqrt(2) and 1.1/sqrt(2.02): perfectly separated
    assert table.loc[("max cosine", "far"), "AUROC (%)"] == pytest.approx(100.0)
    assert table.loc[("max cosine", "far"), "FPR95 (%)"] == pytest.approx(0.0)
    assert list(table.index.get_level_values("score").unique()) == [
        "raw MSP", "MSP of f/(tau ||f||)", "max cosine"]


def test_gradnorm_factor_bounds():
    k = 4
    one_hot = torch.tensor([[100.0, 0.0, 0.0, 0.0]])  # softmax ~ one-hot: 2 (k - 1)
    uniform = torch.zeros(1, k)  # uniform softmax: 0
    table = ch04.gradnorm_factor_table(one_hot, {"u": uniform})
    assert table.loc["ID (test)", "mean factor"] == pytest.approx(2 * (k - 1))
    assert table.loc["u", "mean factor"] == pytest.approx(0.0)
    assert table.loc["u", "AUROC (%)"] == pytest.approx(100.0)


def test_test_fitted_temperature_is_the_test_nll_minimum():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2000, 5, generator=g, dtype=torch.float64) * 4
    y = torch.multinomial(torch.softmax(z / 2.0, dim=1), 1, generator=g).squeeze(1)
    run = SimpleNamespace(val_logits=z[:1000], val_labels=y[:1000], test_logits=z[1000:],
                          test_labels=y[1000:], path=None)
    table = ch04.test_fitted_temperature(run)
    assert table.loc["raw", "T"] == 1.0
    assert table.loc["TS fitted on validation", "T"] == pytest.approx(2.0, rel=0.15)
    # no temperature beats the one fitted on the test set on the test NLL
    nll = table["test NLL"]
    assert nll["TS fitted on test"] <= nll.min() + 1e-9
