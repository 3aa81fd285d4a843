"""Bayesian binning into quantiles (BBQ)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import gammaln

from calnotes._checks import (
    check_positive_float,
    check_positive_int,
)
from calnotes.calibrators.base import (
    _assign_bins,
    _cores,
    _edges,
    _field,
    _StateError,
    _unit,
)
from calnotes.calibrators.binning import _BinaryCoreCalibrator

#: BBQ's prior midpoint of a bin is kept inside ``[eps, 1 - eps]`` (see :class:`BBQ`).
_BBQ_EPS = 1e-12


class BBQ(_BinaryCoreCalibrator):
    r"""Bayesian Binning into Quantiles (Naeini, Cooper & Hauskrecht 2015).

    An ensemble of equal-frequency binnings with B bins each. Inner edges sit halfway
    between the sorted validation scores where the groups meet; outer edges are 0 and 1.
    A cut that would separate tied scores is dropped (that binning then has fewer than B
    bins), so saturated scores of exactly 0 or 1 never make a zero-width bin, and a
    binning that coincides with one already in the ensemble is counted once. The prior
    midpoint ``p_b`` is clipped to ``[1e-12, 1 - 1e-12]`` so that bins whose edges are
    (numerically) at 0 or 1 keep a proper Beta prior.
    Each model M is scored by its marginal likelihood with a Beta prior per bin,

    .. math::
        \begin{aligned}
        \log P(D \mid M) = \sum_b \Big[
        &\log\Gamma(\tfrac{N'}{B}) - \log\Gamma(N_b + \tfrac{N'}{B})\\
        &+ \log\Gamma(m_b + \alpha_b) - \log\Gamma(\alpha_b)\\
        &+ \log\Gamma(n_b + \beta_b) - \log\Gamma(\beta_b)\Big],
        \end{aligned}

    with ``alpha_b = N' p_b / B``, ``beta_b = N' (1 - p_b) / B``, ``p_b`` the bin's midpoint,
    ``m_b`` / ``n_b`` its positives / negatives and ``N' = prior_strength`` (2 in the paper).
    A bin predicts its posterior mean ``(m_b + alpha_b) / (N_b + N' / B)`` and BBQ the
    average of the models' predictions weighted by their posterior
    :math:`P(M \mid D) = P(D \mid M) / \sum_{M'} P(D \mid M')` (a uniform prior over the
    models cancels); :meth:`posterior` lists it. An empty bin would contribute 0 to the
    log score and predict its prior mean ``p_b``; equal-frequency bins are never empty.

    ``n_bins``: the bin counts to use. Default: every B from
    ``max(1, floor(N^(1/3) / spread))`` to ``min(ceil(spread * N^(1/3)), max(1, N // 5))``
    (the paper's range around ``N^(1/3)``, with ``spread = 10``; the ``N // 5`` cap keeps
    about 5 or more scores per bin). ``cores_`` holds ``(weights, [(edges, theta), ...])``.
    """

    def __init__(
        self,
        n_bins: Sequence[int] | None = None,
        spread: float = 10.0,
        prior_strength: float = 2.0,
    ) -> None:
        if n_bins is not None:
            if isinstance(n_bins, (int, np.integer)) or len(n_bins) == 0:
                raise TypeError("n_bins must be a non-empty sequence of ints or None")
            n_bins = tuple(check_positive_int(b, "n_bins") for b in n_bins)
        self.n_bins = n_bins
        self.spread = check_positive_float(spread, "spread")
        self.prior_strength = check_positive_float(prior_strength, "prior_strength")

    def posterior(self, core: int = 0) -> pd.DataFrame:
        r"""The posterior over binning schemes of one binary problem, most probable first.

        One row per binning: ``n_bins`` (its number of bins) and ``posterior``,
        :math:`P(M \mid D)`; the posteriors sum to 1. ``core`` is the class of a
        one-vs-all fit (0, the only one, for a binary fit).
        """
        self._check_fitted()
        core = check_positive_int(core, "core", minimum=0)
        if core >= len(self.cores_):
            raise ValueError(f"core must be below {len(self.cores_)} for this fit, got {core}")
        weights, models = self.cores_[core]
        frame = pd.DataFrame({"n_bins": [len(edges) - 1 for edges, _ in models],
                              "posterior": weights})
        return frame.sort_values("posterior", ascending=False, kind="stable",
                                 ignore_index=True)

    def bin_counts(self, n: int) -> list[int]:
        """The numbers of bins B used for ``n`` validation scores."""
        if self.n_bins is not None:
            return sorted(set(self.n_bins))
        root = n ** (1.0 / 3.0)
        lo = max(1, math.floor(root / self.spread))
        hi = max(lo, min(math.ceil(self.spread * root), max(1, n // 5)))
        return list(range(lo, hi + 1))

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, list[Any]]:
        order = np.argsort(s, kind="stable")
        ss, ts = s[order], t[order]
        n = ss.shape[0]
        cum_pos = np.concatenate([[0.0], np.cumsum(ts)])
        n_prime = self.prior_strength
        log_scores, models = [], []
        seen: set[bytes] = set()
        for target_bins in self.bin_counts(n):
            split = np.round(np.arange(1, target_bins) * n / target_bins).astype(np.int64)
            split = np.unique(np.clip(split, 1, n - 1)) if n > 1 else split[:0]
            # Never cut between tied scores: saturated scores (many exactly 0.0 or 1.0) would
            # otherwise make a zero-width bin whose prior midpoint is 0 or 1 (alpha or
            # beta = 0, an undefined marginal likelihood). A binning seen before is skipped.
            split = split[ss[split - 1] < ss[split]]
            if split.tobytes() in seen:
                continue
            seen.add(split.tobytes())
            nb = split.shape[0] + 1
            inner = 0.5 * (ss[split - 1] + ss[split])
            edges = np.concatenate([[0.0], inner, [1.0]])
            # number of scores <= each edge; bins are (e_{b-1}, e_b], first bin includes 0
            upto = np.searchsorted(ss, edges, side="right")
            upto[0], upto[-1] = 0, n
            n_b = np.diff(upto).astype(np.float64)
            m_b = np.diff(cum_pos[upto])
            # prior midpoint; the clip keeps alpha, beta > 0 when a bin's edges are so close
            # to 0 or 1 that the midpoint (or 1 - midpoint) rounds or underflows to 0
            p_b = np.clip(0.5 * (edges[:-1] + edges[1:]), _BBQ_EPS, 1.0 - _BBQ_EPS)
            alpha = n_prime * p_b / nb
            beta = n_prime * (1.0 - p_b) / nb
            a0 = n_prime / nb
            # empty bins contribute exactly 0
            log_ml = np.sum(
                gammaln(a0)
                - gammaln(n_b + a0)
                + gammaln(m_b + alpha)
                - gammaln(alpha)
                + gammaln(n_b - m_b + beta)
                - gammaln(beta)
            )
            theta = (m_b + alpha) / (n_b + a0)
            log_scores.append(log_ml)
            models.append((edges, theta))
        log_w = np.asarray(log_scores)
        weights = np.exp(log_w - log_w.max())
        return weights / weights.sum(), models

    def _predict_core(self, core: tuple[np.ndarray, list[Any]], s: np.ndarray) -> np.ndarray:
        weights, models = core
        out = np.zeros_like(s, dtype=np.float64)
        for w, (edges, theta) in zip(weights, models, strict=True):
            out += w * theta[_assign_bins(edges, s)]
        return out

    def _state(self) -> dict[str, Any]:
        return {"cores": [{"weights": w.tolist(),
                           "models": [{"edges": e.tolist(), "theta": t.tolist()} for e, t in m]}
                          for w, m in self.cores_]}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        cores = []
        for i, core in enumerate(_cores(state, n_classes)):
            where = f"cores[{i}]"
            weights = _unit(_field(core, "weights", where), f"{where}.weights", (-1,))
            if abs(weights.sum() - 1.0) > 1e-6:
                raise _StateError(f"{where}.weights must sum to 1 (BBQ's model average), got "
                                  f"{weights.sum():.6g}")
            saved = _field(core, "models", where)
            if not isinstance(saved, list) or len(saved) != len(weights):
                raise _StateError(f"{where}.models must be a list of {len(weights)} models")
            models = []
            for j, model in enumerate(saved):
                name = f"{where}.models[{j}]"
                edges = _edges(_field(model, "edges", name), f"{name}.edges")
                theta = _unit(_field(model, "theta", name), f"{name}.theta",
                              (len(edges) - 1,))
                models.append((edges, theta))
            cores.append((weights, models))
        self.cores_ = cores


