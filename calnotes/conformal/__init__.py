"""Split conformal classification: prediction sets with a finite-sample coverage
guarantee from any classifier's probabilities (LAC, APS, RAPS; Mondrian per class), and
the metrics of sets (coverage, size, conditional coverage)."""

from calnotes.conformal.metrics import (
    binned_coverage,
    class_coverage,
    coverage,
    coverage_band,
    set_size,
    size_stratified_coverage,
)
from calnotes.conformal.scores import SCORES, class_scores, label_scores, true_label_rank
from calnotes.conformal.split import (
    SplitConformal,
    check_alpha,
    conformal_quantile,
    prediction_sets,
    raps_k_reg,
)

__all__ = [
    "SCORES", "SplitConformal", "binned_coverage", "check_alpha", "class_coverage",
    "class_scores", "conformal_quantile", "coverage", "coverage_band", "label_scores",
    "prediction_sets", "raps_k_reg", "set_size", "size_stratified_coverage",
    "true_label_rank",
]
