r"""Chapter 4 (LogitNorm): OOD detection read from the chapter's runs.

Detection tables (:func:`detection_table`) have rows ``(temperature, score, ood_set)`` and the
columns of :func:`calnotes.ood.score_report` (``fpr@95tpr``, ``auroc``, ``aupr_in``), each
metric the mean over draws of OOD images. Runs and tables are keyed ``(loss name, seed)``.
Differences between the losses are paired by seed: for per-seed values :math:`a_s`
(cross-entropy) and :math:`b_s` (LogitNorm) of the same seed :math:`s`, :func:`paired_gain` is
the Student-t interval of the mean of :math:`d_s = 100\,(a_s - b_s)` over the :math:`n` seeds,
:math:`\bar d \pm t_{0.975,\,n-1}\, s_d / \sqrt{n}`. The glue functions return
``{glue name: value}`` for the numbers the prose quotes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import calibrators, metrics, ood
from calnotes.metrics.intervals import SeedInterval
from calnotes.runs.ood import run_odin_logits, run_ood_logits, run_test_images
from calnotes.runs.store import StoredRun

__all__ = [
    "DETECTION_METRICS", "average_table", "ce_lower_with_other_scores", "detection_glue",
    "detection_table", "detection_tables", "interval_reading", "mean_norms", "mean_std",
    "metric_table", "msp_histograms", "noise_glue", "norm_ratio_glue", "paired_gain",
    "per_seed", "score_rows", "second_glue", "validation",
]

#: The detection metrics of the tables: label -> column of a detection table.
DETECTION_METRICS = {"FPR95": "fpr@95tpr", "AUROC": "auroc", "AUPR": "aupr_in"}
Key = tuple[str, int]
Runs = Mapping[Key, StoredRun]
Tables = Mapping[Key, pd.DataFrame]


def _md(text: str) -> Any:
    from IPython.display import Markdown

    return Markdown(text)


def validation(run: StoredRun) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's validation logits and labels (a run stored without them is refused)."""
    if run.val_logits is None or run.val_labels is None:
        raise ValueError(f"run {run.path.name} has no validation logits")
    return run.val_logits, run.val_labels


def score_rows(energy_t: float) -> list[tuple[str, str]]:
    """The (temperature, score) rows the tables show. The maximum logit after temperature
    scaling ranks as the raw one (dividing by T keeps its order), so it is shown once."""
    et = f"T={energy_t:g}"
    return [("raw", "msp"), ("raw", "max_logit"), ("raw", "energy"), (et, "energy"),
            ("raw", "odin"), ("TS", "msp"), ("TS", "energy")]


# --- Detection tables -----------------------------------------------------------------------------

def detection_table(run: StoredRun, ood_sets: Mapping[str, torch.Tensor],
                    groups: Mapping[str, Sequence[str]], *, energy_t: float, odin_t: float,
                    odin_eps: float, n_draw: int, n_draws: int, device: Any = "cpu"
                    ) -> pd.DataFrame:
    """FPR95, AUROC and AUPR of one run, rows ``(temperature, score, ood_set)``: the MSP,
    maximum logit and energy of the raw logits, after temperature scaling fitted on the
    validation logits (``TS``) and at the energy's ``T=energy_t``, and ODIN at its own
    temperature; each the mean over ``n_draws`` draws of ``n_draw`` images per OOD set, with
    the averages of ``groups`` (name -> sets) as extra rows."""
    logits = run_ood_logits(run, ood_sets, device=device)
    odin = run_odin_logits(run, {"ID test": run_test_images(run)} | dict(ood_sets),
                           temperature=odin_t, epsilon=odin_eps, device=device)
    t_ts = calibrators.TemperatureScaling().fit(*validation(run)).temperature_
    temperatures = {"raw": 1.0, "TS": t_ts, f"T={energy_t:g}": energy_t}
    plain = ood.mean_over_draws(
        lambda out: ood.score_table(run.test_logits, out, temperatures=temperatures,
                                    averages=groups), logits, n_draw, n_draws)
    odin_table = ood.mean_over_draws(
        lambda out: ood.score_report(odin["ID test"], out, "msp", temperature=odin_t,
                                     averages=groups),
        {k: odin[k] for k in ood_sets}, n_draw, n_draws)
    odin_table = pd.concat({("raw", "odin"): odin_table}, names=["temperature", "score"])
    return pd.concat([plain, odin_table])


def detection_tables(runs: Runs, ood_sets: Mapping[str, torch.Tensor],
                     groups: Mapping[str, Sequence[str]], **options: Any
                     ) -> dict[Key, pd.DataFrame]:
    """:func:`detection_table` of every run, same keys; ``options`` are its keywords."""
    return {key: detection_table(r, ood_sets, groups, **options) for key, r in runs.items()}


def per_seed(dets: Tables, name: str, temperature: str, score: str, row: str,
             column: str = "fpr@95tpr") -> np.ndarray:
    """One metric of loss ``name``, one value per seed (in the order of ``dets``)."""
    values = [t.loc[(temperature, score, row), column] for (n, _), t in dets.items() if n == name]
    if not values:
        raise ValueError(f"name {name!r} has no table in dets")
    return np.array(values)


def mean_std(dets: Tables, names: Iterable[str], rows: Sequence[str],
             column: str = "fpr@95tpr") -> pd.DataFrame:
    """'mean ± std' over seeds, in percent, of ``column`` for each (temperature, score, row
    of ``rows``) and each loss of ``names`` (one column each)."""
    out = {}
    for name in names:
        spread = ood.seed_spread([t for (n, _), t in dets.items() if n == name])
        m, sd = 100 * spread[(column, "mean")], 100 * spread[(column, "std")]
        cell = m.map("{:.1f}".format) + " ± " + sd.map("{:.1f}".format)
        out[name] = cell[cell.index.get_level_values("ood_set").isin(rows)]
    return pd.DataFrame(out)


def metric_table(dets: Tables, names: Iterable[str], rows: Sequence[str],
                 metrics_: Mapping[str, str] = DETECTION_METRICS) -> pd.DataFrame:
    """:func:`mean_std` of every metric of ``metrics_`` (label -> column), stacked under a
    ``metric`` level."""
    names = list(names)
    return pd.concat({label: mean_std(dets, names, rows, column)
                      for label, column in metrics_.items()}, names=["metric"])


def average_table(dets: Tables, names: Iterable[str], average: str,
                  rows: Sequence[tuple[str, str]],
                  metrics_: Mapping[str, str] = DETECTION_METRICS) -> pd.DataFrame:
    """The rows ``(metric, temperature, score)`` of the OOD average ``average``, in the order
    of ``metrics_`` and ``rows`` ((temperature, score) pairs)."""
    table = metric_table(dets, names, [average], metrics_).droplevel("ood_set")
    return table.reindex([(m, *row) for m in metrics_ for row in rows])


def paired_gain(dets: Tables, better: str, worse: str, temperature: str, score: str, row: str,
                column: str = "fpr@95tpr") -> SeedInterval:
    """Student-t interval over seeds of the paired difference ``worse - better`` in points
    (the two losses of one seed share the data split; the tables are in seed order)."""
    return metrics.seed_interval(100 * per_seed(dets, worse, temperature, score, row, column)
                                 - 100 * per_seed(dets, better, temperature, score, row, column))


def interval_reading(interval: SeedInterval, above: str = "LogitNorm lower",
                     below: str = "cross-entropy lower") -> str:
    """How an interval of a paired difference over seeds reads, in words: ``above`` (or
    ``below``) "beyond the seed spread" when it excludes 0 from above (below), else "within
    the seed spread"."""
    if not (hasattr(interval, "low") and hasattr(interval, "high")):
        raise TypeError(f"interval must have low and high, got {type(interval).__name__}")
    return (f"{above} beyond the seed spread" if interval.low > 0
            else f"{below} beyond the seed spread" if interval.high < 0
            else "within the seed spread")


def _score_label(row: tuple[str, str]) -> str:
    return row[1].replace("_", " ") + (" after TS" if row[0] == "TS" else "")


def detection_glue(det: Tables, names: Iterable[str], ce: str, ln: str, ln2: str,
                   rows: Sequence[tuple[str, str]], average: str) -> dict[str, Any]:
    """The detection numbers of the prose, from ResNet-8's tables ``det``: the raw MSP's
    FPR95 (%) of each loss on the OOD average, the paired gains of LogitNorm (``ln``,
    ``ln2``) over cross-entropy with their intervals and readings, the gain with every score
    of ``rows`` (``ch04_gain_<temperature>_<score>``), which scores favour cross-entropy
    beyond or within the seed spread, the best (loss, score) of the table, and the energy's
    and ODIN's FPR95 of ``ce`` and ``ln``."""
    names = list(names)
    gains = {n: paired_gain(det, n, ce, "raw", "msp", average) for n in names if n != ce}
    score_gain = {row: paired_gain(det, ln, ce, *row, average) for row in rows}

    def fpr(name: str, temperature: str, score: str) -> float:
        return float(100 * per_seed(det, name, temperature, score, average).mean())

    other = [row for row in rows if row != ("raw", "msp")]
    cells = {(name, *row): fpr(name, *row) for name in names for row in rows}
    best = min(cells, key=cells.__getitem__)
    out: dict[str, Any] = {
        "ch04_n_seeds": len(per_seed(det, ce, "raw", "msp", average)),
        "ch04_ce_fpr": fpr(ce, "raw", "msp"), "ch04_ln_fpr": fpr(ln, "raw", "msp"),
        "ch04_fpr_gain": gains[ln].estimate,
        "ch04_fpr_gain_ci": _md(f"[{gains[ln].low:.1f}, {gains[ln].high:.1f}]"),
        "ch04_ln2_fpr": fpr(ln2, "raw", "msp"), "ch04_fpr_gain2": gains[ln2].estimate,
        "ch04_fpr_gain2_ci": _md(f"[{gains[ln2].low:.1f}, {gains[ln2].high:.1f}]"),
        "ch04_fpr_gain_reading": _md(interval_reading(gains[ln])),
        "ch04_fpr_gain2_reading": _md(interval_reading(gains[ln2])),
        "ch04_other_beyond": _md(", ".join(_score_label(r) for r in other
                                           if score_gain[r].high < 0) or "none of them"),
        "ch04_other_within": _md(", ".join(_score_label(r) for r in other
                                           if score_gain[r].high >= 0) or "none"),
        "ch04_best_fpr": cells[best],
        "ch04_best_what": _md(f"{best[0]} with the {best[2].replace('_', ' ')} score"
                              + (" after TS" if best[1] == "TS" else "")),
        "ch04_ce_energy_fpr": fpr(ce, "raw", "energy"),
        "ch04_ln_energy_fpr": fpr(ln, "raw", "energy"),
        "ch04_ce_odin_fpr": fpr(ce, "raw", "odin"), "ch04_ln_odin_fpr": fpr(ln, "raw", "odin"),
    }
    out |= {f"ch04_gain_{t}_{s}": score_gain[(t, s)].estimate for t, s in rows}
    return out


def ce_lower_with_other_scores(det: Tables, ce: str, ln: str, rows: Sequence[tuple[str, str]],
                               average: str) -> bool:
    """Whether cross-entropy's mean FPR95 is below LogitNorm's with every score of ``rows``
    but the raw MSP (a negative paired gain of LogitNorm)."""
    return all(paired_gain(det, ln, ce, *row, average).estimate < 0
               for row in rows if row != ("raw", "msp"))


def noise_glue(det: Tables, regime_det: Tables, second_det: Tables | None, ce: str, ln: str,
               energy_t: float, noise: str, regime_ln: str | None = None) -> dict[str, Any]:
    """The noise numbers of the prose: the raw MSP's FPR95 (%) of both losses on the noise
    average ``noise`` and LogitNorm's paired gain (ResNet-8), the energy's FPR95 at ``T =
    energy_t`` for ResNet-8 and LeNet-5 without weight decay (its LogitNorm named
    ``regime_ln``, by default ``ln``), and the raw MSP's FPR95 with the second dataset in
    distribution (``second_det``, when given)."""
    et = f"T={energy_t:g}"
    out: dict[str, Any] = {
        "ch04_energy_t": energy_t,
        "ch04_noise_ce_fpr": float(100 * per_seed(det, ce, "raw", "msp", noise).mean()),
        "ch04_noise_ln_fpr": float(100 * per_seed(det, ln, "raw", "msp", noise).mean()),
        "ch04_noise_gain_ci": _md(f"{paired_gain(det, ln, ce, 'raw', 'msp', noise):.1f}")}
    for key, dets, lns in [("", det, ln), ("_reg", regime_det, regime_ln or ln)]:
        for name_key, name in [("ce", ce), ("ln", lns)]:
            out[f"ch04_noise{key}_{name_key}_energy"] = float(
                100 * per_seed(dets, name, et, "energy", noise).mean())
    if second_det is not None:
        for name_key, name in [("ce", ce), ("ln", ln)]:
            out[f"ch04_noise_second_{name_key}_msp"] = float(
                100 * per_seed(second_det, name, "raw", "msp", noise).mean())
    return out


def second_glue(second_det: Tables, ce: str, ln: str, average: str) -> dict[str, Any]:
    """The raw MSP's FPR95 (%) of both losses with the second dataset in distribution, and
    LogitNorm's paired gain with its interval."""
    return {
        "ch04_second_ce_fpr": float(100 * per_seed(second_det, ce, "raw", "msp", average).mean()),
        "ch04_second_ln_fpr": float(100 * per_seed(second_det, ln, "raw", "msp", average).mean()),
        "ch04_second_gain_ci": _md(f"{paired_gain(second_det, ln, ce, 'raw', 'msp', average):.1f}"),
    }


# --- The length of the logits --------------------------------------------------------------

def mean_norms(runs: Runs, ood_sets: Mapping[str, torch.Tensor], names: Iterable[str],
               seeds: Sequence[int], device: Any = "cpu") -> pd.DataFrame:
    r"""Mean :math:`\lVert f(x)\rVert` of each loss's logits on the test images and on each
    OOD set, averaged over ``seeds``."""
    return pd.DataFrame({
        name: np.mean([[float(runs[(name, s)].test_logits.norm(dim=1).mean())]
                       + [float(v.norm(dim=1).mean())
                          for v in run_ood_logits(runs[(name, s)], ood_sets,
                                                  device=device).values()]
                       for s in seeds], axis=0)
        for name in names
    }, index=["ID (test)", *ood_sets]).rename_axis("mean ||f(x)||")


def norm_ratio_glue(norms: pd.DataFrame, natural: Sequence[str], ce: str, ln: str
                    ) -> dict[str, float]:
    """The mean over the natural OOD sets of each loss's OOD norm over its test norm."""
    return {f"ch04_{key}_norm_ratio": float((norms.loc[list(natural), name]
                                             / norms.loc["ID (test)", name]).mean())
            for key, name in (("ce", ce), ("ln", ln))}


def msp_histograms(runs: Mapping[str, StoredRun], ood_sets: Mapping[str, torch.Tensor],
                   device: Any = "cpu") -> Any:
    """One panel per run (title -> run): histograms of the raw MSP on the test images (black)
    and on each OOD set, each set's share of its images per bin, log scale."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(11, 3.6), gridspec_kw={"wspace": 0.25},
                             squeeze=False)
    for ax, (name, r) in zip(axes[0], runs.items(), strict=True):
        logits = run_ood_logits(r, ood_sets, device=device)
        scores = {"ID (test)": ood.msp(r.test_logits.double())}
        scores |= {k: ood.msp(v.double()) for k, v in logits.items()}
        lo = min(float(s.min()) for s in scores.values())
        hi = max(float(s.max()) for s in scores.values())
        bins = np.linspace(lo, max(hi, lo + 1e-6), 41)
        for i, (label, s) in enumerate(scores.items()):
            ax.hist(np.asarray(s), bins=bins, histtype="step", linewidth=1.4,
                    weights=np.full(len(s), 1 / len(s)),
                    color="black" if i == 0 else f"C{i - 1}", label=label)
        ax.set(xlabel="MSP (raw logits)", ylabel="share of the set", yscale="log", title=name)
    axes[0, 0].legend(fontsize=8)
    return fig


