r"""Calibration metrics: ECE, MCE, ACE, classwise ECE, SECE, NLL, Brier, error; their
streaming versions (``update`` / ``compute``, ``calnotes.metrics.streaming``) and
scikit-learn scorers (:func:`sklearn_scorer`). ``sample_weight`` is taken by the binned
metrics, NLL and Brier.

Vocabulary: ``probs (N, C)`` (or ``(N,)``, the positive-class probability of a binary
problem, read as the two columns ``[1 - p, p]``) and integer ``labels (N,)``. The
*top-label* view uses the confidence :math:`c_i = \max_k p_{ik}` and the indicator
:math:`r_i = 1[\arg\max_k p_{ik} = y_i]` (ties go to the first maximal class).

Binning convention. Bins are half-open on the left, :math:`B_m = (b_{m-1}, b_m]`; a
confidence of exactly ``b_0`` (0 for equal-width bins) goes to the first bin and one of
exactly 1.0 to the last, so no sample is ever dropped. A value exactly on an interior edge
goes to the lower bin. Edges are compared in the dtype the computation runs in (float32 for
float32 or half input, float64 for float64 input).

* ``binning="uniform"``: :math:`b_m = m / M`.
* ``binning="quantile"``: :math:`b_m` is the :math:`m/M` quantile of the binned values
  (linear interpolation between order statistics, the "linear" rule of
  :func:`numpy.quantile`), so ``b_0`` is the smallest value and ``b_M`` the largest and the
  bins hold about :math:`N/M` samples each (exactly when :math:`M` divides :math:`N` and
  there are no ties). Tied values are never split: all samples equal to an edge go to the
  lower bin, so with many ties (for example saturated confidences of 1.0) some bins hold
  more than :math:`N/M` samples and others are empty. Empty bins carry no weight.

Intervals. :func:`bootstrap_interval` resamples the test samples to give any of these
metrics, or the paired difference of two predictions' metrics, a percentile interval;
:func:`seed_interval` gives a mean over training seeds, or a difference of two such means,
a t interval.

Return types. Scalar metrics return a 0-d tensor on the input's device (in the input's
floating dtype, at least float32) for torch input, so that they can be used in a graph,
and a Python ``float`` for numpy input. Sums over samples are accumulated in float64
(float32 on MPS, which has no float64).
"""

from calnotes.metrics._common import (
    BINNINGS as BINNINGS,
)
from calnotes.metrics._common import (
    NORMS as NORMS,
)
from calnotes.metrics._common import (
    confidences_and_correct,
    probs_from_logits,
    resolve_n_bins,
)
from calnotes.metrics.bands import (
    BAND_METHODS as BAND_METHODS,
)
from calnotes.metrics.bands import (
    ReliabilityBands,
    clopper_pearson,
    reliability_bands,
    wilson,
)
from calnotes.metrics.binned import (
    ReliabilityBins,
    ace,
    classwise_ece,
    debiased_l2_ce,
    ece,
    mce,
    reliability_bins,
)
from calnotes.metrics.calibration_tests import (
    CalibrationTest,
    consistency_test,
    skce,
    skce_test,
    spiegelhalter_test,
)
from calnotes.metrics.decomposition import SCORES as SCORES
from calnotes.metrics.decomposition import (
    CorpCurve,
    ScoreDecomposition,
    corp_curve,
    score_decomposition,
)
from calnotes.metrics.intervals import (
    BootstrapInterval,
    SeedInterval,
    bootstrap,
    bootstrap_interval,
    interval_from_resamples,
    seed_interval,
)
from calnotes.metrics.scores import brier, error, nll, one_vs_rest_errors
from calnotes.metrics.selective import (
    RiskCoverage,
    aurc,
    eaurc,
    risk_coverage_curve,
    selective_risk,
)
from calnotes.metrics.sklearn import SCORER_METRICS as SCORER_METRICS
from calnotes.metrics.sklearn import CalibrationScorer, sklearn_scorer
from calnotes.metrics.smooth import SECE_EXACT_MAX_N as SECE_EXACT_MAX_N
from calnotes.metrics.smooth import SECE_GRID_TOL as SECE_GRID_TOL
from calnotes.metrics.smooth import SECE_METHODS as SECE_METHODS
from calnotes.metrics.smooth import SMECE_MIN_BANDWIDTH as SMECE_MIN_BANDWIDTH
from calnotes.metrics.smooth import sece, smece, smece_bandwidth
from calnotes.metrics.streaming import (
    StreamingBrier,
    StreamingClasswiseECE,
    StreamingECE,
    StreamingMCE,
    StreamingMetric,
    StreamingNLL,
    StreamingSECE,
    as_torchmetric,
)
from calnotes.metrics.summary import BINNED_METRICS as BINNED_METRICS
from calnotes.metrics.summary import METRICS as METRICS
from calnotes.metrics.summary import REPORT_METRICS as REPORT_METRICS
from calnotes.metrics.summary import calibration_report

__all__ = [
    "BootstrapInterval",
    "SeedInterval",
    "ReliabilityBins",
    "RiskCoverage",
    "aurc",
    "eaurc",
    "risk_coverage_curve",
    "selective_risk",
    "ace",
    "bootstrap",
    "bootstrap_interval",
    "brier",
    "calibration_report",
    "classwise_ece",
    "confidences_and_correct",
    "debiased_l2_ce",
    "ece",
    "error",
    "mce",
    "nll",
    "one_vs_rest_errors",
    "probs_from_logits",
    "reliability_bins",
    "ReliabilityBands",
    "clopper_pearson",
    "reliability_bands",
    "CalibrationTest",
    "consistency_test",
    "skce",
    "skce_test",
    "spiegelhalter_test",
    "CorpCurve",
    "ScoreDecomposition",
    "corp_curve",
    "score_decomposition",
    "resolve_n_bins",
    "wilson",
    "sece",
    "smece",
    "smece_bandwidth",
    "seed_interval",
    "interval_from_resamples",
    "CalibrationScorer",
    "sklearn_scorer",
    "StreamingBrier",
    "StreamingClasswiseECE",
    "StreamingECE",
    "StreamingMCE",
    "StreamingMetric",
    "StreamingNLL",
    "StreamingSECE",
    "as_torchmetric",
]

