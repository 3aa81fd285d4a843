"""Tests of top-label calibration and the CORP decomposition of the Brier score, with
intervals, for the report (:mod:`calnotes.report`, which re-exports
:func:`calibration_tests`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from . import metrics
from ._checks import ArrayLike

__all__ = ["calibration_tests"]


def _numpy(x: ArrayLike) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def calibration_tests(
    probs: Mapping[str, ArrayLike], labels: ArrayLike, *, n_bins: int | str = 15,
    n_boot: int = 200, seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Tests of top-label calibration and the CORP decomposition of each method's test
    predictions (one row per name of ``probs``).

    The tests' table holds Spiegelhalter's z and its p-value, the top-label SKCE and the
    p-value of its asymptotic test, and the p-value of the binned consistency test of the
    ECE (``n_bins`` bins, ``n_boot`` resamples); their common null is that each prediction
    is right with probability its confidence. The decomposition's table holds
    :class:`~calnotes.metrics.BootstrapInterval` s (debiased, ``n_boot`` resamples) of the
    top-label Brier score :math:`\\frac1N\\sum_i (c_i - r_i)^2` and its miscalibration,
    discrimination and uncertainty. CORP's miscalibration is measured on the samples its
    isotonic fit was fitted to, so it leans upward (more the more steps the fit has); its
    interval is the noise of the test samples around that, not around 0.
    """
    test_rows, parts = {}, {}
    for name, p in probs.items():
        z = metrics.spiegelhalter_test(p, labels)
        k = metrics.skce_test(p, labels, mode="top-label", n_boot=n_boot, seed=seed)
        c = metrics.consistency_test(p, labels, n_bins, n_boot=n_boot, seed=seed)
        test_rows[name] = {"spiegelhalter_z": z.statistic, "spiegelhalter_p": z.p_value,
                           "skce": k.statistic, "skce_p": k.p_value, "consistency_p": c.p_value}
        q, y = _numpy(p), _numpy(labels)
        rng = np.random.default_rng(seed)
        draws = [metrics.score_decomposition(q[i], y[i], "brier")
                 for i in (rng.integers(0, len(y), len(y)) for _ in range(n_boot))]
        whole = metrics.score_decomposition(q, y, "brier")
        parts[name] = {part: metrics.interval_from_resamples(
            getattr(whole, part), [getattr(d, part) for d in draws], method="debiased")
            for part in ("score", "miscalibration", "discrimination", "uncertainty")}
    tests = pd.DataFrame.from_dict(test_rows, orient="index")
    tests.index.name = "method"
    decomposition = pd.DataFrame.from_dict(parts, orient="index")
    decomposition.index.name = "method"
    return tests, decomposition
