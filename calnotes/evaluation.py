"""Compare post-hoc calibrators: fit each on validation logits, measure it on test logits.

::

    cmp = compare_calibrators(val_logits, val_labels, test_logits, test_labels)
    cmp.table                    # one row per method: error, nll, brier, ece, mce
    cmp.probs["temperature"]     # calibrated test probabilities (N, C)
    cmp.relative_change()        # (method - uncalibrated) / uncalibrated, for ece and mce
    cmp.bootstrap()              # test-set noise of each ECE and of its gap to temperature
    cmp.interval("isotonic", "ece", reference="uncalibrated", relative=True)  # 95% interval
    table1({"MNIST, LeNet-5": cmp, ...})        # Guo et al.'s Table 1 layout
    compare_with_sklearn(val_logits, val_labels, test_logits, test_labels)   # binary only

The first row of every table is the uncalibrated model, ``softmax(test_logits)``. Method
names are the keys of :data:`calnotes.calibrators.CALIBRATORS`; :data:`LABELS` gives the
names Guo et al. print. Metrics are fractions (multiply by 100 for percent) computed by
:func:`calnotes.metrics.calibration_report` with ``n_bins`` equal-width bins.

Every probability of a comparison, the uncalibrated softmax included, is float64 (float32
on MPS): float32 logits are widened exactly, so a comparison of float32 logits and one of
the same logits as float64 are the same computation and give the same table. (Rounded to
float32, the step values of the binning methods, ratios such as 2/3, land on either side
of a bin edge such as 10/15, and the MCE of a sparse bin moves with them.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import metrics
from ._checks import ArrayLike, check_labels, check_logits, check_positive_int
from .calibrators import CALIBRATORS, Calibrator, IsotonicCalibration, PlattScaling

__all__ = [
    "BINARY_METHODS",
    "LABELS",
    "MULTICLASS_METHODS",
    "TABLE_METRICS",
    "UNCALIBRATED",
    "CalibrationComparison",
    "compare_calibrators",
    "compare_with_sklearn",
    "shift_report",
    "table1",
]

#: Name of the row holding the uncalibrated model.
UNCALIBRATED = "uncalibrated"
#: The binary calibrators of Guo et al. (2017), section 4.1.
BINARY_METHODS = ("histogram", "isotonic", "bbq", "platt")
#: The columns of Guo et al.'s Table 1, in its order (binning methods one-vs-all).
MULTICLASS_METHODS = ("histogram", "isotonic", "bbq", "temperature", "vector", "matrix")
#: Metrics of the ``table`` of a :class:`CalibrationComparison`, in column order.
TABLE_METRICS = ("error", "nll", "brier", "ece", "mce")
#: Display names, as in Guo et al.'s Table 1.
LABELS = {
    UNCALIBRATED: "Uncalibrated",
    "histogram": "Hist. binning",
    "isotonic": "Isotonic",
    "bbq": "BBQ",
    "temperature": "Temp. scaling",
    "vector": "Vector scaling",
    "matrix": "Matrix scaling",
    "platt": "Platt scaling",
    "dirichlet": "Dirichlet",
    "scaling_binning": "Scaling-binning",
    "beta": "Beta calibration",
}


@dataclass
class CalibrationComparison:
    """What :func:`compare_calibrators` measured.

    ``table``: index ``[UNCALIBRATED, *methods]`` (named ``"method"``), columns
    :data:`TABLE_METRICS`. ``probs``: test probabilities per row of the table.
    ``calibrators``: the fitted calibrator of each method. ``labels``: the test labels.
    """

    table: pd.DataFrame
    probs: dict[str, ArrayLike] = field(repr=False)
    calibrators: dict[str, Calibrator] = field(repr=False)
    n_bins: int = 15
    labels: ArrayLike | None = field(default=None, repr=False)

    def bootstrap(
        self, reference: str = "temperature", n_boot: int = 200, seed: int = 0
    ) -> pd.DataFrame:
        """Test-set bootstrap of the ECE, to tell real differences between methods from noise.

        Draws ``n_boot`` resamples (with replacement) of the test samples, the same resample
        for every method, and returns per method ``ece_std``, the standard deviation of its
        ECE, and ``diff_std``, that of its ECE minus the ECE of ``reference`` (paired, so
        usually smaller). The calibrators are not refitted: this is the noise of the test
        estimate only, not that of the validation split or of training.
        """
        if self.labels is None:
            raise ValueError("this comparison holds no test labels; use compare_calibrators")
        if reference not in self.probs:
            raise ValueError(f"reference must be one of {list(self.probs)}, got {reference!r}")
        n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
        y = np.asarray(self.labels.cpu() if isinstance(self.labels, torch.Tensor)
                       else self.labels)
        probs = {m: (p.detach().cpu().double().numpy() if isinstance(p, torch.Tensor)
                     else np.asarray(p, dtype=np.float64)) for m, p in self.probs.items()}
        rng = np.random.default_rng(seed)
        draws = np.empty((n_boot, len(probs)))
        for b in range(n_boot):
            idx = rng.integers(0, len(y), len(y))
            draws[b] = [metrics.ece(p[idx], y[idx], n_bins=self.n_bins) for p in probs.values()]
        frame = pd.DataFrame(draws, columns=list(probs))
        out = pd.DataFrame({"ece_std": frame.std(ddof=1),
                            "diff_std": frame.sub(frame[reference], axis=0).std(ddof=1)})
        out.index.name = "method"
        return out

    def interval(
        self, method: str, metric: str = "ece", reference: str | None = None, *,
        relative: bool = False, n_boot: int = 1000, level: float = 0.95, seed: int = 0,
    ) -> metrics.BootstrapInterval:
        """Percentile bootstrap interval over the test samples of ``method``'s ``metric``
        (one of :data:`TABLE_METRICS`, binned metrics with this comparison's ``n_bins``).

        With ``reference`` (another row, e.g. :data:`UNCALIBRATED`) the interval is that of
        the paired difference ``metric(method) - metric(reference)``, or with
        ``relative=True`` of ``(metric(method) - metric(reference)) / metric(reference)``,
        as in :meth:`relative_change`. See :func:`calnotes.metrics.bootstrap_interval`;
        the calibrators are not refitted.
        """
        if self.labels is None:
            raise ValueError("this comparison holds no test labels; use compare_calibrators")
        for name, value in (("method", method), ("reference", reference)):
            if value is not None and value not in self.probs:
                raise ValueError(f"{name} must be one of {list(self.probs)}, got {value!r}")
        if metric not in TABLE_METRICS:
            raise ValueError(f"metric must be one of {TABLE_METRICS}, got {metric!r}")
        return metrics.bootstrap_interval(
            metric, self.probs[method], self.labels,
            None if reference is None else self.probs[reference], relative=relative,
            n_bins=self.n_bins, n_boot=n_boot, level=level, seed=seed)

    def relative_change(self, columns: Sequence[str] = ("ece", "mce")) -> pd.DataFrame:
        """``(value - uncalibrated) / uncalibrated`` per method (rows) and metric (columns).

        -0.6 means 60% lower than the uncalibrated model. The uncalibrated row is left out;
        a metric whose uncalibrated value is 0 gives inf or NaN.
        """
        if isinstance(columns, str) or not isinstance(columns, Sequence) or not columns:
            raise ValueError(f"columns must be a non-empty sequence of names from "
                             f"{list(self.table.columns)}")
        missing = [c for c in columns if c not in self.table.columns]
        if missing:
            raise ValueError(f"unknown columns {missing}; the table has {list(self.table.columns)}")
        cols = list(columns)
        base = self.table.loc[UNCALIBRATED, cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            change = (self.table[cols] - base) / base
        return change.drop(index=UNCALIBRATED)


def _check_methods(methods: Any) -> list[str]:
    if isinstance(methods, str) or not isinstance(methods, Sequence) or len(methods) == 0:
        raise ValueError(
            f"methods must be a non-empty sequence of names from {sorted(CALIBRATORS)}"
        )
    names = list(methods)
    for name in names:
        if not isinstance(name, str) or name not in CALIBRATORS:
            raise ValueError(f"methods must hold names from {sorted(CALIBRATORS)}, got {name!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"methods must not repeat a name, got {names}")
    return names


def _widened(z: torch.Tensor, from_numpy: bool) -> ArrayLike:
    """Checked logits as float64 (exact from float16/32), in the kind the caller passed
    (numpy or a tensor on its device; MPS tensors stay float32, MPS has no float64)."""
    if from_numpy:
        return z.numpy().astype(np.float64, copy=False)
    return z if z.device.type == "mps" else z.to(torch.float64)


def compare_calibrators(
    val_logits: ArrayLike,
    val_labels: ArrayLike,
    test_logits: ArrayLike,
    test_labels: ArrayLike,
    methods: Sequence[str] = MULTICLASS_METHODS,
    *,
    n_bins: int = 15,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> CalibrationComparison:
    """Fit every calibrator in ``methods`` on the validation split; evaluate on the test split.

    ``options`` maps a method name to keyword arguments of its constructor, e.g.
    ``{"matrix": {"reg": 1e-2}}``. Validation and test logits must have the same number of
    classes. numpy logits give numpy probabilities, tensors give tensors; all of them
    float64 (float32 on MPS), computed from the logits widened to float64.
    """
    names = _check_methods(methods)
    n_bins = check_positive_int(n_bins, "n_bins")
    options = {} if options is None else options
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict of dicts, got {type(options).__name__}")
    stray = sorted(set(options) - set(names))
    if stray:
        raise ValueError(f"options given for {stray}, which are not in methods {names}")
    zv, val_numpy = check_logits(val_logits, "val_logits")
    zt, test_numpy = check_logits(test_logits, "test_logits")
    if zv.shape[1] != zt.shape[1]:
        raise ValueError(
            f"val_logits has {zv.shape[1]} classes but test_logits has {zt.shape[1]}"
        )
    check_labels(val_labels, zv.shape[0], zv.shape[1], "val_labels")
    check_labels(test_labels, zt.shape[0], zt.shape[1], "test_labels")

    val_logits, test_logits = _widened(zv, val_numpy), _widened(zt, test_numpy)
    probs: dict[str, ArrayLike] = {UNCALIBRATED: metrics.probs_from_logits(test_logits)}
    fitted: dict[str, Calibrator] = {}
    for name in names:
        kwargs = options.get(name, {})
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"options[{name!r}] must be a dict, got {type(kwargs).__name__}")
        cal = CALIBRATORS[name](**kwargs).fit(val_logits, val_labels)
        fitted[name] = cal
        probs[name] = cal.predict_proba(test_logits)
    table = metrics.calibration_report(probs, test_labels, n_bins=n_bins, metrics=TABLE_METRICS)
    table.index.name = "method"
    return CalibrationComparison(table=table, probs=probs, calibrators=fitted, n_bins=n_bins,
                                 labels=test_labels)


def table1(
    comparisons: Mapping[str, CalibrationComparison], metric: str = "ece", labels: bool = True
) -> pd.DataFrame:
    """One metric in Guo et al.'s Table 1 layout: a row per comparison, a column per method.

    Columns follow the order of the methods (uncalibrated first) over all comparisons; a
    method missing from a comparison is NaN. ``labels=True`` uses the names of
    :data:`LABELS`.
    """
    if not isinstance(comparisons, Mapping) or len(comparisons) == 0:
        raise ValueError("comparisons must be a non-empty dict {row name: CalibrationComparison}")
    for key, value in comparisons.items():
        if not isinstance(value, CalibrationComparison):
            raise TypeError(
                f"comparisons[{key!r}] must be a CalibrationComparison, got {type(value).__name__}"
            )
    if metric not in TABLE_METRICS:
        raise ValueError(f"metric must be one of {TABLE_METRICS}, got {metric!r}")
    order: list[str] = []
    for cmp in comparisons.values():
        order += [m for m in cmp.table.index if m not in order]
    frame = pd.DataFrame(
        {name: cmp.table[metric].reindex(order) for name, cmp in comparisons.items()}
    ).T
    frame.columns.name = "method"
    if labels:
        frame.columns = pd.Index([LABELS.get(m, m) for m in order], name="method")
    return frame


# --------------------------------------------------------------------------- scikit-learn


def _score_estimator() -> Any:
    """A fitted sklearn classifier whose decision function is its single input column."""
    from sklearn.base import BaseEstimator, ClassifierMixin

    class ScoreAsDecision(ClassifierMixin, BaseEstimator):
        def fit(self, x: np.ndarray, y: np.ndarray) -> ScoreAsDecision:
            self.classes_ = np.array([0, 1])
            return self

        def decision_function(self, x: np.ndarray) -> np.ndarray:
            return np.asarray(x, dtype=np.float64)[:, 0]

        def predict(self, x: np.ndarray) -> np.ndarray:
            return (self.decision_function(x) > 0).astype(np.int64)

    return ScoreAsDecision


def _binary_inputs(logits: ArrayLike, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(s, p)``: the score ``z_1 - z_0`` and ``p = softmax(z)_1`` of binary logits, float64."""
    z, _ = check_logits(logits, name)
    if z.shape[1] != 2:
        raise ValueError(f"{name} must be binary (N, 2) logits, got {z.shape[1]} classes")
    z64 = z.detach().cpu().to(torch.float64)
    return (z64[:, 1] - z64[:, 0]).numpy(), torch.softmax(z64, dim=1)[:, 1].numpy()


def compare_with_sklearn(
    val_logits: ArrayLike,
    val_labels: ArrayLike,
    test_logits: ArrayLike,
    test_labels: ArrayLike,
    *,
    n_bins: int = 15,
) -> pd.DataFrame:
    """Our isotonic and Platt calibrators next to scikit-learn's, on the same binary scores.

    Four pairs, fitted on the validation split and applied to the test split:

    * ``isotonic, on p``: :class:`~calnotes.calibrators.IsotonicCalibration` vs
      ``IsotonicRegression`` on ``p = softmax(z)_1`` (identical by construction: ours wraps
      it);
    * ``isotonic, on s``: the same vs ``CalibratedClassifierCV(FrozenEstimator(.),
      method="isotonic")``, which regresses on the decision score ``s = z_1 - z_0``: the
      fitted steps agree, the interpolation between them differs (linear in s, not in p);
    * ``Platt``: :class:`~calnotes.calibrators.PlattScaling` vs unpenalized
      ``LogisticRegression`` on ``s``;
    * ``Platt, smoothed targets``: ``PlattScaling(prior_correction=True)`` vs
      ``CalibratedClassifierCV(method="sigmoid")`` (Platt's targets (N+ + 1)/(N+ + 2)).

    Columns: ``ece_calnotes``, ``ece_sklearn`` (``n_bins`` bins, top-label) and
    ``max_abs_diff``, the largest difference of the positive-class probabilities.
    Needs scikit-learn >= 1.6 (``sklearn.frozen``).
    """
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.frozen import FrozenEstimator
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    n_bins = check_positive_int(n_bins, "n_bins")
    s_val, p_val = _binary_inputs(val_logits, "val_logits")
    s_test, p_test = _binary_inputs(test_logits, "test_logits")
    y_val = check_labels(val_labels, len(s_val), 2, "val_labels").cpu().numpy()
    y_test = check_labels(test_labels, len(s_test), 2, "test_labels").cpu().numpy()
    z_val = np.stack([np.zeros_like(s_val), s_val], axis=1)
    z_test = np.stack([np.zeros_like(s_test), s_test], axis=1)
    x_val, x_test = s_val[:, None], s_test[:, None]
    frozen = FrozenEstimator(_score_estimator()().fit(x_val, y_val))

    ours_iso = IsotonicCalibration().fit(z_val, y_val).predict_proba(z_test)[:, 1]
    ours_platt = PlattScaling().fit(z_val, y_val).predict_proba(z_test)[:, 1]
    ours_smooth = PlattScaling(prior_correction=True).fit(z_val, y_val).predict_proba(z_test)[:, 1]
    iso_p = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(p_val, y_val)
    iso_s = CalibratedClassifierCV(frozen, method="isotonic").fit(x_val, y_val)
    logreg = LogisticRegression(C=np.inf, tol=1e-10, max_iter=1000).fit(x_val, y_val)
    sigmoid = CalibratedClassifierCV(frozen, method="sigmoid").fit(x_val, y_val)
    pairs = {
        "isotonic, on p": (ours_iso, iso_p.predict(p_test), "IsotonicRegression"),
        "isotonic, on s": (ours_iso, iso_s.predict_proba(x_test)[:, 1],
                           "CalibratedClassifierCV(isotonic)"),
        "Platt": (ours_platt, logreg.predict_proba(x_test)[:, 1], "LogisticRegression"),
        "Platt, smoothed targets": (ours_smooth, sigmoid.predict_proba(x_test)[:, 1],
                                    "CalibratedClassifierCV(sigmoid)"),
    }
    rows = []
    for ours, ref, estimator in pairs.values():
        ref = np.clip(np.asarray(ref, dtype=np.float64), 0.0, 1.0)
        rows.append({
            "sklearn": estimator,
            "ece_calnotes": float(metrics.ece(np.asarray(ours, dtype=np.float64), y_test,
                                              n_bins=n_bins)),
            "ece_sklearn": float(metrics.ece(ref, y_test, n_bins=n_bins)),
            "max_abs_diff": float(np.max(np.abs(ours - ref))),
        })
    return pd.DataFrame(rows, index=pd.Index(list(pairs), name="calibrator"))


def shift_report(
    shifted: Mapping[Any, tuple[ArrayLike, ArrayLike]], val_logits: ArrayLike | None = None,
    val_labels: ArrayLike | None = None, n_bins: int = 15,
) -> pd.DataFrame:
    """Calibration of one model on data shifted by graded amounts.

    ``shifted`` maps a shift level (any label: degrees, a severity, a date) to the
    ``(logits, labels)`` of the data at that level. Each level gets a row of error, NLL,
    Brier score, ECE and MCE (``n_bins`` equal-width bins; percent but NLL); with
    validation logits of the *unshifted* distribution, also the same after temperature
    scaling fitted on them (columns ``ts_<metric>``), which shows whether the fitted
    temperature keeps its gain as the data move away.
    """
    from calnotes.calibrators import TemperatureScaling

    if not isinstance(shifted, Mapping) or not shifted:
        raise ValueError("shifted must be a non-empty dict {level: (logits, labels)}")
    if (val_logits is None) != (val_labels is None):
        raise ValueError("val_logits and val_labels must be given together")
    scaler = (None if val_logits is None or val_labels is None
              else TemperatureScaling().fit(val_logits, val_labels))
    rows = {}
    for level, pair in shifted.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"shifted[{level!r}] must be a (logits, labels) pair")
        logits, labels = pair
        row = _scores(metrics.probs_from_logits(logits), labels, n_bins)
        if scaler is not None:
            row.update({f"ts_{k}": v for k, v in
                        _scores(scaler.predict_proba(logits), labels, n_bins).items()})
        rows[level] = row
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("level")


def _scores(probs: ArrayLike, labels: ArrayLike, n_bins: int) -> dict[str, float]:
    return {"error": 100 * float(metrics.error(probs, labels)),
            "nll": float(metrics.nll(probs, labels)),
            "brier": 100 * float(metrics.brier(probs, labels)),
            "ece": 100 * float(metrics.ece(probs, labels, n_bins=n_bins)),
            "mce": 100 * float(metrics.mce(probs, labels, n_bins=n_bins))}
