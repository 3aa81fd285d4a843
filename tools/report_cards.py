"""Estimator report cards: a simulation study of calibration diagnostics, stored once.

Synthetic binary models with a known true calibration error (calnotes.synthetic) are
sampled at n = 100 ... 100,000; every estimator's bias, SD and RMSE, the coverage of the
percentile and debiased bootstrap intervals of the ECE, and the rejection rates of the
tests at 5% are computed by calnotes.report_cards and stored as one JSON entry of the
results store (results/study-report-cards), with its provenance.

    OMP_NUM_THREADS=1 python tools/report_cards.py            # the stored study
    OMP_NUM_THREADS=1 python tools/report_cards.py --smoke    # seconds, prints only
    OMP_NUM_THREADS=1 python tools/report_cards.py --force    # recompute and replace
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import integrate

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import calnotes  # noqa: E402
from calnotes import metrics  # noqa: E402
from calnotes.report_cards import estimator_card, interval_card, rejection_card  # noqa: E402
from calnotes.runs.store import (  # noqa: E402
    default_results_root,
    git_commit,
    read_entry,
    write_entry,
)
from calnotes.synthetic import CURVES, SyntheticModel  # noqa: E402

KIND = "report-cards-study"
FOLDER = "study-report-cards"
FILE = "study.json"
MODELS = ("calibrated", "overconfident", "underconfident")
SKCE_BANDWIDTH = 0.1

#: Full study: repeats per sample size of each part.
FULL = {
    "estimators": {100: 200, 1000: 100, 10_000: 20, 100_000: 5},
    "smece": {100: 4, 1000: 4},
    "skce": {100: 200, 1000: 60},
    "intervals": {100: 150, 1000: 80, 10_000: 10},
    "tests": {100: 200, 1000: 100, 10_000: 20},
    "skce_test": {100: 100, 1000: 10},
    "n_boot": 200,
}
SMOKE = {
    "estimators": {100: 4, 1000: 3},
    "smece": {100: 1},
    "skce": {100: 3},
    "intervals": {100: 3, 1000: 2},
    "tests": {100: 3, 1000: 2},
    "skce_test": {100: 2},
    "n_boot": 50,
}


def l2_target(model: SyntheticModel) -> float:
    r"""The L2 calibration error :math:`\sqrt{E(f(c) - c)^2}` by quadrature."""
    f = CURVES[model.curve]
    value, _ = integrate.quad(lambda c: (float(f(np.asarray(c))) - c) ** 2 * model._density(c),
                              0.5, 1.0, limit=200)
    return float(np.sqrt(value))


def skce_target(model: SyntheticModel, nu: float = SKCE_BANDWIDTH, grid: int = 2001) -> float:
    r"""Top-label SKCE :math:`E[e^{-|c - c'|/\nu} (f(c) - c)(f(c') - c')]` by a product
    trapezoid rule over the confidence density."""
    c = np.linspace(0.5, 1.0, grid)
    w = np.array([model._density(x) for x in c]) * np.gradient(c)
    w[[0, -1]] /= 2  # trapezoid end weights (np.gradient uses the full step at the ends)
    g = (CURVES[model.curve](c) - c) * w
    return float(g @ np.exp(-np.abs(c[:, None] - c[None]) / nu) @ g)


def _card(fn: Any, model: SyntheticModel, sizes: dict[int, int], things: dict[str, Any],
          seed: int, **kw: Any) -> pd.DataFrame:
    frames = [fn(model, [n], things, repeats=r, seed=seed, **kw) for n, r in sizes.items()]
    return pd.concat(frames, ignore_index=True)


def run_study(plan: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Every card of the study for every model: a JSON-ready dict of records."""
    n_boot = plan["n_boot"]
    estimators = {
        "ECE (15 equal-width)": lambda p, y: metrics.ece(p, y, n_bins=15),
        "ECE (15 equal-mass)": lambda p, y: metrics.ece(p, y, n_bins=15, binning="quantile"),
        "ECE (auto equal-mass)": lambda p, y: metrics.ece(p, y, n_bins="auto",
                                                          binning="quantile"),
        "debiased L2": lambda p, y: metrics.debiased_l2_ce(p, y, n_bins=15),
        "SECE": lambda p, y: metrics.sece(p, y),
    }
    intervals = {
        "percentile": lambda p, y: metrics.bootstrap("ece", p, y, n_bins=15, n_boot=n_boot),
        "debiased": lambda p, y: metrics.bootstrap("ece", p, y, n_bins=15, n_boot=n_boot,
                                                   method="debiased"),
    }
    tests = {
        "Spiegelhalter": lambda p, y: metrics.spiegelhalter_test(p, y),
        "consistency (ECE)": lambda p, y: metrics.consistency_test(p, y, n_boot=n_boot),
    }
    out: dict[str, Any] = {"estimators": [], "intervals": [], "tests": [], "truth": {}}
    for curve in MODELS:
        model = SyntheticModel(curve)
        tce, l2, sk = model.true_calibration_error(), l2_target(model), skce_target(model)
        out["truth"][curve] = {"tce": tce, "l2": l2, "skce": sk}
        parts = [
            _card(estimator_card, model, plan["estimators"], estimators, seed,
                  targets={"debiased L2": l2}),
            _card(estimator_card, model, plan["skce"],
                  {"top-label SKCE": lambda p, y: metrics.skce(p, y, mode="top-label",
                                                                bandwidth=SKCE_BANDWIDTH)},
                  seed, targets={"top-label SKCE": sk}),
        ]
        if curve != "underconfident":
            parts.append(_card(estimator_card, model, plan["smece"],
                               {"smooth ECE": lambda p, y: metrics.smece(p, y)}, seed))
        est = pd.concat(parts, ignore_index=True)
        est.insert(0, "model", curve)
        out["estimators"] += est.to_dict("records")
        iv = _card(interval_card, model, plan["intervals"], intervals, seed)
        iv.insert(0, "model", curve)
        out["intervals"] += iv.to_dict("records")
        tt = pd.concat([
            _card(rejection_card, model, plan["tests"], tests, seed),
            _card(rejection_card, model, plan["skce_test"],
                  {"SKCE (asymptotic)": lambda p, y: metrics.skce_test(p, y, mode="top-label")},
                  seed)], ignore_index=True)
        tt.insert(0, "model", curve)
        out["tests"] += tt.to_dict("records")
    return out


def study_folder(root: Path | None = None) -> Path:
    return Path(root or default_results_root()) / FOLDER


def compute(smoke: bool = False, seed: int = 0) -> dict[str, Any]:
    """The study with its provenance (version, commit, seconds, date)."""
    start = time.time()
    study = run_study(SMOKE if smoke else FULL, seed=seed)
    study["provenance"] = {
        "calnotes_version": calnotes.__version__, "git_commit": git_commit(),
        "seconds": round(time.time() - start, 1),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seed": seed, "smoke": smoke,
        "plan": {k: ({str(n): r for n, r in v.items()} if isinstance(v, dict) else v)
                 for k, v in (SMOKE if smoke else FULL).items()},
    }
    return study


def store(study: dict[str, Any], root: Path | None = None, force: bool = False) -> Path:
    folder = study_folder(root)
    if force and folder.exists():
        shutil.rmtree(folder)
    data = json.dumps(study, allow_nan=False, sort_keys=True).encode()
    write_entry(folder, {FILE: data}, {"kind": KIND, **study["provenance"]})
    return folder


def load(root: Path | None = None) -> dict[str, Any]:
    """The stored study (``CorruptRun``/``OutdatedRun`` if damaged, FileNotFoundError if
    never computed: run this script)."""
    folder = study_folder(root)
    if not folder.exists():
        raise FileNotFoundError(f"no stored study at {folder}: run tools/report_cards.py")
    _, files = read_entry(folder, kind=KIND)
    return json.loads(files[FILE])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny study, printed, not stored")
    parser.add_argument("--force", action="store_true", help="replace a stored study")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.smoke and not args.force and study_folder().exists():
        print(f"stored study exists: {study_folder()} (--force to recompute)")
        return 0
    study = compute(smoke=args.smoke, seed=args.seed)
    if args.smoke:
        print(pd.DataFrame(study["estimators"]).round(4).to_string())
    else:
        print(f"stored {store(study, force=args.force)}")
    print(f"{study['provenance']['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
