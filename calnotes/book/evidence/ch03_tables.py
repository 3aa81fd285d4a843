"""Chapter 3's tables and glued numbers: the names of its rows and methods, the configs of
its runs, which digit is hardest, the binary networks' confidence, the lecture's changes
beside the claims table, the multiclass comparison's ranking and diagnosis, and the verdict
counts its prose states. Each ``*_glue`` function returns ``{glue name: value}``.

Its figures are in ``calnotes.book.evidence.ch03_figures``; its measures in
``calnotes.book.evidence.ch03``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes.book.evidence.ch03 import (
    RULE_EPOCHS,
    binary_r18_config,
    evaluate,
    rule_epochs,
    validation_error,
)
from calnotes.evaluation import (
    BINARY_METHODS,
    LABELS,
    MULTICLASS_METHODS,
    UNCALIBRATED,
    compare_calibrators,
    table1,
)
from calnotes.runs.experiment import default_config

__all__ = ["BINARY_COMPARED", "DESIGN_WORDS", "ESTIMATORS", "GUO_TABLE1", "LECTURE_ROWS",
           "MULTI_COMPARED", "PROSE", "binary_config", "binary_glue", "ch01_config",
           "compare", "confidence_table", "count_reproduced", "deep_config",
           "design_of", "diagnosis", "diagnosis_glue", "guo_table1", "hardest_share",
           "lecture_glue", "lecture_table", "mnist_ts_table", "model_name",
           "one_vs_rest", "ovr_table", "platt_glue", "ranking", "ranking_glue",
           "row_name", "rule_table", "setting_glue", "show", "subsets", "table1_glue",
           "vector_by_class", "why_nine_glue"]

#: The calibrators compared: Guo et al.'s, and the later Dirichlet calibration and
#: scaling-binning (both any K) and beta calibration (binary only).
BINARY_COMPARED = (*BINARY_METHODS, "beta", "dirichlet", "scaling_binning")
MULTI_COMPARED = (*MULTICLASS_METHODS, "dirichlet", "scaling_binning")

#: Method names inside sentences.
PROSE = {"histogram": "histogram binning", "isotonic": "isotonic regression", "bbq": "BBQ",
         "platt": "Platt scaling", "temperature": "temperature scaling",
         "vector": "vector scaling", "matrix": "matrix scaling", "beta": "beta calibration",
         "dirichlet": "Dirichlet calibration", "scaling_binning": "scaling-binning"}

#: The interval each evaluator design gives, in words.
DESIGN_WORDS = {"bootstrap": "a 95% bootstrap interval over the test images of its one run",
                "one-sample t over seeds": "a one-sample Student-t interval over the seeds",
                "paired t over seeds": "a paired Student-t interval over the seeds"}

#: The lecture's three changes (claim id part -> words).
LECTURE_ROWS = {"iso-ece": "isotonic, ECE", "iso-mce": "isotonic, MCE",
                "platt-ece": "Platt, ECE"}

#: The three estimators of the calibration error the ranking uses (keywords of
#: :func:`calnotes.book.evidence.ch03.evaluate`).
ESTIMATORS = {"ECE, 15 equal-width bins": {"metric": "ece", "binning": "width"},
              "ECE, 15 equal-mass bins": {"metric": "ece", "binning": "mass"},
              "SECE (bin-free)": {"metric": "sece"}}

#: Guo et al. (2017), Table 1: ECE (%), 15 bins, published values quoted as printed.
GUO_TABLE1 = {
    "CIFAR-10, ResNet-110": [4.60, 0.58, 0.81, 0.54, 0.83, 0.88, 1.00],
    "CIFAR-100, ResNet-110": [16.53, 2.66, 4.99, 5.46, 1.26, 1.32, 25.49],
    "CIFAR-10, LeNet-5": [3.02, 1.56, 1.85, 1.59, 0.93, 1.15, 1.16],
    "CIFAR-100, LeNet-5": [4.85, 6.48, 2.35, 3.77, 2.02, 2.09, 13.24]}

#: The multiclass rows' short ids in the claims file.
ROW_IDS = ("fm-lenet", "mnist-lenet", "fm-r14")

NOT_EVALUATED = "not evaluated (SMOKE)"


# --- names and configs ---------------------------------------------------------------------

def show(table: pd.DataFrame) -> pd.DataFrame:
    """A metrics table: error, ECE and MCE in percent; NLL (nats) and Brier score as is;
    rounded to 3 decimals."""
    out = table.copy()
    out[["error", "ece", "mce"]] *= 100
    return out.rename(columns={"error": "error (%)", "ece": "ECE (%)", "mce": "MCE (%)",
                               "nll": "NLL", "brier": "Brier"}).round(3)


def model_name(model: str) -> str:
    """Display name of a model, e.g. resnet18 -> ResNet-18, lenet5 -> LeNet-5."""
    if not isinstance(model, str):
        raise TypeError(f"model must be a string, got {type(model).__name__}")
    return re.sub(r"^resnet-?(\d+)$", r"ResNet-\1", re.sub(r"^lenet-?5$", "LeNet-5", model))


def row_name(dataset: str, model: str) -> str:
    """Display name of a dataset/model pair, e.g. Fashion-MNIST, ResNet-14."""
    names = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10",
             "cifar100": "CIFAR-100", "svhn": "SVHN"}
    return f"{names.get(dataset, dataset)}, {model_name(model)}"


def subsets(train_subset: int | None, smoke: bool) -> dict[str, Any]:
    """The training subset (0 or None: all); in SMOKE mode tiny splits everywhere."""
    if smoke:
        return {"train_subset": 64, "val_size": 128, "test_subset": 128}
    return {"train_subset": train_subset or None}


def binary_config(dataset: str, model: str, positive_class: int | None, seed: int,
                  epochs: int, train_subset: int | None, smoke: bool) -> dict[str, Any]:
    """A run "``positive_class`` vs the rest" of ``model`` (no weight decay, lr 0.05), or of
    all classes when ``positive_class`` is None, for ``seed``: ``epochs`` epochs (1 in SMOKE
    mode) on ``train_subset`` training images (:func:`subsets`)."""
    binary = {} if positive_class is None else {"positive_class": positive_class}
    return default_config(
        dataset=dataset, model=model, **binary, weight_decay=0.0, lr=0.05,
        seed=seed, epochs=1 if smoke else epochs, **subsets(train_subset, smoke))


def ch01_config(seed: int, smoke: bool) -> dict[str, Any]:
    """Chapter 1's Fashion-MNIST LeNet-5 (30 epochs, all training images, no weight decay),
    shared through the store; in SMOKE mode 1 epoch on 2,000 images, tested on 1,000."""
    return default_config(
        dataset="fashion_mnist", model="lenet5", epochs=1 if smoke else 30, weight_decay=0.0,
        lr=0.05, seed=seed, **({"train_subset": 2000, "test_subset": 1000} if smoke else {}))


def deep_config(dataset: str, model: str, seed: int, epochs: int, train_subset: int | None,
                augment: bool, weight_decay: float, smoke: bool) -> dict[str, Any]:
    """The deep row of the multiclass comparison: ``model`` on ``dataset`` (lr 0.05),
    ``epochs`` epochs (1 in SMOKE mode) on ``train_subset`` training images."""
    return default_config(
        dataset=dataset, model=model, weight_decay=weight_decay, lr=0.05, augment=augment,
        seed=seed, epochs=1 if smoke else epochs, **subsets(train_subset, smoke))


def setting_glue(runs: Mapping[str, Any], mnist_deep: Mapping[str, Any], lenet: str,
                 deep: str) -> dict[str, Any]:
    """The binary networks' settings as the prose names them: the deep network's name, both
    networks' epochs, the deep network's training images (``"all"`` for all of them), and
    the epochs of the ten-class deep network (its config ``mnist_deep``)."""
    subset = runs[deep].config["train_subset"]
    return {"ch03_deep_name": deep, "ch03_lenet_epochs": runs[lenet].config["epochs"],
            "ch03_deep_binary_epochs": runs[deep].config["epochs"],
            "ch03_mnist_deep_epochs": mnist_deep["epochs"],
            "ch03_deep_binary_subset": f"{subset:,}" if subset else "all"}


def vector_by_class(comparison: Any, dataset: str, seed: int = 0) -> pd.DataFrame:
    """Vector scaling's per-class :math:`w_k T` (its weights times temperature scaling's
    :math:`T`, fitted in the same comparison), one column per class of ``dataset``."""
    from calnotes.data import load_dataset

    wt = (comparison.calibrators["vector"].weight_
          * comparison.calibrators["temperature"].temperature_)
    class_names = load_dataset(dataset, seed=seed).class_names
    return pd.DataFrame([wt], index=["w_k T"], columns=class_names)


def guo_table1() -> pd.DataFrame:
    """Guo et al.'s published Table 1 (``GUO_TABLE1``): a row per dataset/model, a
    column per method (uncalibrated first, then Guo et al.'s six methods)."""
    return pd.DataFrame(list(GUO_TABLE1.values()), index=list(GUO_TABLE1), columns=pd.Index(
        [LABELS[m] for m in (UNCALIBRATED, *MULTICLASS_METHODS)], name="method"))


def design_of(claims: pd.DataFrame | None, claim_id: str) -> str:
    """The interval design of a claim of the claims table, in words (``DESIGN_WORDS``);
    without a table (SMOKE) ``"not evaluated (SMOKE)"``."""
    if claims is None:
        return NOT_EVALUATED
    design = claims.set_index("id").loc[claim_id, "design"]
    return DESIGN_WORDS.get(design, design)


# --- why the digit 9 -----------------------------------------------------------------------

def hardest_share(run: Any, n_boot: int, seed: int) -> np.ndarray:
    """Per class :math:`k`, the share of ``n_boot`` bootstrap resamples of the test images in
    which "k vs not-k" has the most errors, :math:`\\sum_i w_i\\,\\mathbf 1[(y_i = k) \\ne
    (\\hat y_i = k)]` with :math:`w_i` the resample's counts (ties to the smaller class)."""
    if int(n_boot) < 1:
        raise ValueError(f"n_boot must be a positive int, got {n_boot}")
    pred, y = run.test_logits.argmax(1).numpy(), run.test_labels.numpy()
    k = np.arange(run.test_logits.shape[1])
    wrong = (y[:, None] == k) != (pred[:, None] == k)  # (N, K): errors of "k vs not-k"
    rng = np.random.default_rng(seed)
    weights = np.stack([np.bincount(rng.integers(0, len(y), len(y)), minlength=len(y))
                        for _ in range(n_boot)])
    top = (weights @ wrong).argmax(axis=1)  # ties to the smaller class
    return np.bincount(top, minlength=len(k)) / n_boot


def one_vs_rest(runs: Mapping[str, Any], n_boot: int, seed: int) -> dict[str, pd.DataFrame]:
    """Per run, :func:`calnotes.metrics.one_vs_rest_errors` of its float64 test softmax
    with ``hardest_in``, the :func:`hardest_share` in percent."""
    return {name: metrics.one_vs_rest_errors(torch.softmax(r.test_logits.double(), dim=1),
                                             r.test_labels).assign(
                hardest_in=100 * hardest_share(r, n_boot, seed))
            for name, r in runs.items()}


def ovr_table(ovr: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The one-vs-rest errors of every network side by side, after the count of test images
    of each class (read from the first network), rounded to 1 decimal."""
    first = next(iter(ovr.values()))
    return pd.concat({"test images": first[["positives"]],
                      **{name: t[["missed", "false_alarms", "errors", "confused_with",
                                  "hardest_in"]]
                         .rename(columns={"false_alarms": "false alarms",
                                          "confused_with": "mostly with",
                                          "hardest_in": "most errors in (%)"})
                         for name, t in ovr.items()}}, axis=1).round(1)


def why_nine_glue(ovr: Mapping[str, pd.DataFrame], positive_class: int, lenet: str,
                  deep: str) -> dict[str, Any]:
    """The positive class's one-vs-rest errors and most confused partner for both networks
    (``lenet``, ``deep``), its rank among the classes for ``lenet``, and the share of
    resamples in which each network's hardest class is hardest."""
    hardest = {name: int(t["errors"].idxmax()) for name, t in ovr.items()}
    nine = ovr[lenet].loc[positive_class]
    return {
        "ch03_lenet_hardest_share": ovr[lenet].loc[hardest[lenet], "hardest_in"],
        "ch03_deep_hardest_share": ovr[deep].loc[hardest[deep], "hardest_in"],
        "ch03_deep_nine_errors": int(ovr[deep].loc[positive_class, "errors"]),
        "ch03_deep_nine_partner": int(ovr[deep].loc[positive_class, "confused_with"]),
        "ch03_nine_errors": int(nine["errors"]),
        "ch03_nine_rank": int(ovr[lenet]["errors"].rank(ascending=False, method="min")
                              .loc[positive_class]),
        "ch03_nine_partner": int(nine["confused_with"])}


# --- experiment 1: the binary warm-up ------------------------------------------------------

def rule_table(seed: int, available: bool) -> tuple[pd.Series, int | None]:
    """The declared epoch rule on the stored candidates of ``seed`` (read from the store,
    never trained; none unless ``available``): their validation error (%) by epochs, and
    the rule's choice (:func:`~calnotes.book.evidence.ch03.rule_epochs`) once every
    candidate of ``RULE_EPOCHS`` is stored, else None."""
    from calnotes.runs.store import RunStore

    store = RunStore()
    candidates = {e: store.load(binary_r18_config(seed, e)) for e in RULE_EPOCHS
                  if available and store.exists(binary_r18_config(seed, e))}
    val_error = pd.Series({e: validation_error(r) for e, r in candidates.items()},
                          name="validation error (%)", dtype=float)
    complete = sorted(candidates) == sorted(RULE_EPOCHS)
    return val_error, (rule_epochs(candidates) if complete else None)


def _confidence_row(run: Any) -> dict[str, float]:
    conf, correct = metrics.confidences_and_correct(metrics.probs_from_logits(
        run.test_logits.double()), run.test_labels)
    return {"accuracy (%)": 100 * float(correct.mean()),
            "confidence (%)": 100 * float(conf.mean()),
            "gap (points)": 100 * float(conf.mean() - correct.mean())}


def confidence_table(runs: Mapping[tuple[str, int], Any]) -> pd.DataFrame:
    """Per ``(model, seed)`` run: test accuracy :math:`\\bar a` and mean top-label confidence
    :math:`\\bar c` (%), and the gap :math:`\\bar c - \\bar a` in points (positive:
    overconfident)."""
    table = pd.DataFrame({key: _confidence_row(run) for key, run in runs.items()}).T
    table.index.names = ["model", "seed"]
    return table


def binary_glue(per_seed: pd.DataFrame, seeds: Mapping[str, Sequence[int]],
                tags: Mapping[str, str]) -> dict[str, Any]:
    """Per network (``tags``: network -> glue tag) the range over seeds of the confidence
    gap of :func:`confidence_table` (one value for one seed) and its number of seeds, as a
    number and in words."""
    gaps = per_seed["gap (points)"]
    out: dict[str, Any] = {}
    for name, tag in tags.items():
        low, high = float(gaps.loc[name].min()), float(gaps.loc[name].max())
        n = len(seeds[name])
        out[f"ch03_gap_{tag}"] = f"{low:+.2f}" if n == 1 else f"{low:+.2f} to {high:+.2f}"
        out[f"ch03_seeds_{tag}"] = n
        out[f"ch03_seeds_{tag}_early"] = f"{n} seed" + "s" * (n > 1)
    return out


def _cell(row: Any) -> str:
    return f"{row['estimate']:+.0f} [{row['low']:+.0f}, {row['high']:+.0f}]"


def lecture_table(claims: pd.DataFrame | None, deep: str) -> pd.DataFrame | str:
    """The lecture's three changes beside ours under the lecture's evaluation and the
    book's, for LeNet-5 and the ``deep`` network (estimate [95% interval], %), from the
    claims table; without it, a sentence saying so."""
    if claims is None:
        return "the verdict table is evaluated at the book's parameters only"
    by_id = claims.set_index("id")
    return pd.DataFrame([
        {"model": name, "change": words,
         "lecture (%)": f"{by_id.loc[f'{net}-{rid}-lecture', 'paper']:+.0f}",
         "lecture's evaluation (%)": _cell(by_id.loc[f"{net}-{rid}-lecture"]),
         "book's evaluation (%)": _cell(by_id.loc[f"{net}-{rid}-book"])}
        for net, name in (("lenet", "LeNet-5"), ("r18", deep))
        for rid, words in LECTURE_ROWS.items()]).set_index(["model", "change"])


def lecture_glue(claims: pd.DataFrame | None) -> dict[str, Any]:
    """How many of the lecture's six numbers lie inside our intervals under each
    evaluation, which evaluation explains them better (in words), and the designs of the
    LeNet-5 and ResNet-18 rows."""
    if claims is not None:
        by_id = claims.set_index("id")
        inside = {conv: sum(int(r["low"] <= r["paper"] <= r["high"]) for r in
                            (by_id.loc[f"{net}-{rid}-{conv}"] for net in ("lenet", "r18")
                             for rid in LECTURE_ROWS))
                  for conv in ("lecture", "book")}
        better = (max(inside, key=lambda c: inside[c])
                  if inside["lecture"] != inside["book"] else None)
    else:
        inside, better = {"lecture": 0, "book": 0}, None
    words = {"lecture": "the lecture's own loop", "book": "the book's binning",
             None: "neither convention more than the other"}
    return {"ch03_lenet_design": design_of(claims, "lenet-iso-ece-book"),
            "ch03_deep_design": design_of(claims, "r18-iso-ece-book"),
            "ch03_inside_lecture": inside["lecture"], "ch03_inside_book": inside["book"],
            "ch03_better_convention": words[better]}


# --- experiment 2: the multiclass comparison -----------------------------------------------

def table1_glue(multi: Mapping[str, Any], deep: str) -> dict[str, Any]:
    """The ``deep`` row's test ECE and error (%) before and after temperature scaling and its
    temperature, and the range of the fitted temperatures over the rows of ``multi``."""
    tab = multi[deep].table
    temperatures = {name: c.calibrators["temperature"].temperature_ for name, c in multi.items()}
    return {"ch03_deep_row": deep,
            "ch03_deep_ece": 100 * tab.loc[UNCALIBRATED, "ece"],
            "ch03_deep_ts_ece": 100 * tab.loc["temperature", "ece"],
            "ch03_deep_error": 100 * tab.loc[UNCALIBRATED, "error"],
            "ch03_deep_ts_error": 100 * tab.loc["temperature", "error"],
            "ch03_deep_T": temperatures[deep],
            "ch03_T_min": min(temperatures.values()), "ch03_T_max": max(temperatures.values())}


def ranking(multi: Mapping[str, Any], runs: Mapping[str, Any], n_bins: int = 15
            ) -> pd.DataFrame:
    """Every method's test calibration error (%) per row under each estimator of
    ``ESTIMATORS``: rows (estimator, row), a column per method."""
    return pd.concat({
        estimator: pd.DataFrame({row: {LABELS[m]: 100 * evaluate(
            probs, runs[row].test_labels, bins=n_bins, **kw) for m, probs in c.probs.items()}
            for row, c in multi.items()}).T
        for estimator, kw in ESTIMATORS.items()}, names=["estimator", "row"])


def count_reproduced(claims: pd.DataFrame | None, ids: Sequence[str],
                     verdict: Callable[[str, str], str]) -> str:
    """``'k of n'``: how many of the claims ``ids`` get a verdict starting "reproduces"
    (``verdict(chapter, id)``); without a claims table (SMOKE) ``"not evaluated (SMOKE)"``."""
    if claims is None:
        return NOT_EVALUATED
    verdicts = [verdict("03", i) for i in ids]
    return f"{sum(v.startswith('reproduces') for v in verdicts)} of {len(verdicts)}"


def ranking_glue(table: pd.DataFrame, claims: pd.DataFrame | None,
                 verdict: Callable[[str, str], str]) -> dict[str, Any]:
    """Histogram binning's ECE range under equal-width and equal-mass bins (from
    :func:`ranking`), and how many of the claims comparing temperature scaling with
    histogram binning, histogram binning with isotonic regression and BBQ, and temperature
    scaling with no calibration reproduce."""
    hist = LABELS["histogram"]
    out: dict[str, Any] = {
        "ch03_hist_width_max": float(table.loc["ECE, 15 equal-width bins"][hist].max()),
        "ch03_hist_mass_min": float(table.loc["ECE, 15 equal-mass bins"][hist].min()),
        "ch03_hist_mass_max": float(table.loc["ECE, 15 equal-mass bins"][hist].max())}
    for est in ("width", "mass", "sece"):
        out[f"ch03_ts_hist_{est}"] = count_reproduced(
            claims, [f"ts-vs-hist-{r}-{est}" for r in ROW_IDS], verdict)
    for other in ("isotonic", "bbq"):
        out[f"ch03_hist_{other}"] = count_reproduced(
            claims, [f"hist-vs-{other}-{r}-{e}" for r in ROW_IDS for e in ("mass", "sece")],
            verdict)
    out["ch03_ts_lowers"] = count_reproduced(claims, [f"ts-lowers-ece-{r}" for r in ROW_IDS],
                                             verdict)
    return out


def diagnosis(multi: Mapping[str, Any], runs: Mapping[str, Any], n_boot: int = 1000,
              seed: int = 0) -> pd.DataFrame:
    """Per row: the method of lowest test ECE (equal-width bins), temperature scaling's ECE
    minus it (points) with a paired 95% bootstrap interval over the test images, the
    network's validation errors, and the smallest and largest :math:`w_k T` of vector
    scaling against temperature scaling."""
    ece_keys = table1(dict(multi), "ece", labels=False)
    best = ece_keys.drop(columns=UNCALIBRATED).idxmin(axis=1)
    gap_ci = {n: c.interval("temperature", "ece", reference=best[n], n_boot=n_boot,
                            seed=seed).scaled(100) for n, c in multi.items()}
    wt = {name: c.calibrators["vector"].weight_ * c.calibrators["temperature"].temperature_
          for name, c in multi.items()}
    return pd.DataFrame({
        "best method": best.map(LABELS),
        "TS minus best (pts)": 100 * (ece_keys["temperature"] - ece_keys.min(axis=1)),
        "95% interval": [f"[{iv.low:+.2f}, {iv.high:+.2f}]" for iv in gap_ci.values()],
        "validation errors": [int((r.val_logits.argmax(1) != r.val_labels).sum())
                              for r in runs.values()],
        "min of w_k T": [w.min() for w in wt.values()],
        "max of w_k T": [w.max() for w in wt.values()],
    }, index=ece_keys.index)


def diagnosis_glue(table: pd.DataFrame, multi: Mapping[str, Any], rows: Mapping[str, str]
                   ) -> dict[str, Any]:
    """The :func:`diagnosis` numbers the prose reads, for ``rows`` with the keys ``deep``,
    ``lenet`` (Fashion-MNIST LeNet-5) and ``mnist``: the range of :math:`w_k T`, the
    validation errors, and the MNIST row's error and ECE (%) uncalibrated and after matrix
    scaling."""
    deep, lenet, mnist = rows["deep"], rows["lenet"], rows["mnist"]
    mnist_tab = multi[mnist].table
    return {"ch03_wt_min": table.loc[deep, "min of w_k T"],
            "ch03_wt_max": table.loc[deep, "max of w_k T"],
            "ch03_lenet_wt_min": table.loc[lenet, "min of w_k T"],
            "ch03_lenet_wt_max": table.loc[lenet, "max of w_k T"],
            "ch03_val_err_deep": int(table.loc[deep, "validation errors"]),
            "ch03_val_err_lenet": int(table.loc[lenet, "validation errors"]),
            "ch03_val_err_mnist": int(table.loc[mnist, "validation errors"]),
            "ch03_mnist_err": 100 * mnist_tab.loc[UNCALIBRATED, "error"],
            "ch03_mnist_matrix_err": 100 * mnist_tab.loc["matrix", "error"],
            "ch03_mnist_matrix_ece": 100 * mnist_tab.loc["matrix", "ece"],
            "ch03_mnist_ece": 100 * mnist_tab.loc[UNCALIBRATED, "ece"]}


# --- experiment 3: multiclass MNIST --------------------------------------------------------

def compare(run: Any, methods: Sequence[str] = MULTICLASS_METHODS, n_bins: int = 15) -> Any:
    """:func:`calnotes.evaluation.compare_calibrators` on a run's validation and test
    logits."""
    return compare_calibrators(run.val_logits, run.val_labels, run.test_logits,
                               run.test_labels, methods=methods, n_bins=n_bins)


def mnist_ts_table(comparisons: Mapping[str, Any], runs: Mapping[str, Any], *,
                   n_boot: int = 1000, seed: int = 0) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Temperature scaling of each network: test error and mean confidence, ECE
    uncalibrated and after scaling (95% bootstrap intervals over the test images), its
    relative change of the ECE and :math:`T`, as text; and the glued numbers (keyed
    ``ch03_mnist_{tag}_*`` with tag ``lenet`` for the first network, ``deep`` for the
    second)."""
    ece = {(name, m): c.interval(m, "ece", n_boot=n_boot, seed=seed).scaled(100)
           for name, c in comparisons.items() for m in (UNCALIBRATED, "temperature")}
    ts_ci = {name: c.interval("temperature", "ece", reference=UNCALIBRATED, relative=True,
                              n_boot=n_boot, seed=seed).scaled(100)
             for name, c in comparisons.items()}
    conf = {name: float(metrics.confidences_and_correct(
        c.probs[UNCALIBRATED], runs[name].test_labels)[0].mean())
        for name, c in comparisons.items()}
    acc = {name: 1 - c.table.loc[UNCALIBRATED, "error"] for name, c in comparisons.items()}
    table = pd.DataFrame({
        name: {"error (%)": f"{100 * (1 - acc[name]):.2f}",
               "confidence (%)": f"{100 * conf[name]:.2f}",
               "ECE (%)": f"{ece[(name, UNCALIBRATED)]:.2f}",
               "ECE, TS (%)": f"{ece[(name, 'temperature')]:.2f}",
               "TS change (%)": f"{ts_ci[name]:+.0f}",
               "T": f"{c.calibrators['temperature'].temperature_:.2f}"}
        for name, c in comparisons.items()}).T
    out: dict[str, Any] = {}
    for tag, name in zip(("lenet", "deep"), comparisons, strict=False):
        out[f"ch03_mnist_{tag}_conf"] = 100 * conf[name]
        out[f"ch03_mnist_{tag}_acc"] = 100 * acc[name]
        out[f"ch03_mnist_{tag}_ts_ci"] = f"{ts_ci[name]:+.0f}"
    return table, out


# --- the claims' verdicts in the prose -----------------------------------------------------

def platt_glue(claims: pd.DataFrame | None, verdict: Callable[[str, str], str]
               ) -> dict[str, Any]:
    """The verdicts of the two readings of the lecture's unsigned Platt number (a rise and a
    fall of the ECE) per network and evaluation, which reading more of them support (in
    words), and the verdicts of the binary networks' comparison and of isotonic regression
    against Platt scaling."""
    platt = {f"{net}-{reading}-{conv}": f"{net}-platt-ece{suffix}-{conv}"
             for net in ("lenet", "r18") for conv in ("lecture", "book")
             for reading, suffix in (("rise", ""), ("fall", "-fall"))}
    out: dict[str, Any] = {
        f"ch03_platt_{name}": verdict("03", cid) if claims is not None else NOT_EVALUATED
        for name, cid in platt.items()}
    if claims is not None:
        held = {reading: sum(verdict("03", cid).startswith("reproduces")
                             for name, cid in platt.items() if f"-{reading}-" in name)
                for reading in ("rise", "fall")}
        reading = ("the reduction" if held["fall"] > held["rise"] else "the rise"
                   if held["rise"] > held["fall"] else "neither reading more than the other")
    else:
        reading = NOT_EVALUATED
    out["ch03_platt_reading"] = reading
    for cid in ("r18-vs-lenet-bin-error", "r18-vs-lenet-bin-ece",
                "iso-vs-platt-lenet-lecture", "iso-vs-platt-r18-lecture"):
        out[f"ch03_v_{cid}"] = verdict("03", cid) if claims is not None else NOT_EVALUATED
    return out
