r"""Chapter 5 (meta-regularization): the learned gamma of FLγ-SECE and FLγ-DECE read from
the stored runs, into the chapter's figures, tables and glued numbers.

Histories are keyed ``(method, seed)`` (:func:`gamma_histories`); ``gamma_mean`` and
``gamma_std`` are the mean and standard deviation of gamma over the test images after each
epoch. The learning-rate phases are those of :data:`MILESTONES`: the reference's decays at
epochs 150 and 250 of 350.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes.runs.store import StoredRun

__all__ = [
    "DECE", "GAMMA_KEYS", "MILESTONES", "SECE", "gamma_by_epoch", "gamma_check",
    "gamma_figure", "gamma_histories", "gamma_sensitivity", "late_gamma_glue", "meta_loop_figure",
    "milestone_epochs", "pace", "pace_glue", "sensitivity_figure",
]

#: The reference's learning-rate decays, at epochs 150 and 250 of 350, as fractions.
MILESTONES = [3 / 7, 5 / 7]
SECE, DECE = "FLgamma-SECE", "FLgamma-DECE"


# --- the histories ---------------------------------------------------------------------

def gamma_histories(runs: Mapping[str, Mapping[int, StoredRun]]
                    ) -> dict[tuple[str, int], pd.DataFrame]:
    """The histories of the two learned-gamma methods, keyed ``(method, seed)``."""
    return {(name, s): r.history.to_frame() for name in (SECE, DECE)
            for s, r in runs[name].items()}


def milestone_epochs(epochs: int) -> list[int]:
    """The last epoch at each rate before a decay of :data:`MILESTONES`."""
    return [max(1, round(f * epochs)) for f in MILESTONES]


def gamma_figure(gamma_hist: Mapping[tuple[str, int], pd.DataFrame], seed: int,
                 epochs: int) -> Any:
    """Left: the mean of gamma over the test images by epoch, ± its std (seed ``seed``);
    right: its std, every seed; dotted lines at the learning-rate decays."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    first = {name: gamma_hist[(name, seed)] for name in (SECE, DECE)}
    plots.metric_curves(first[SECE]["epoch"],
                        {n.replace("gamma", "γ"): h["gamma_mean"] for n, h in first.items()},
                        bands={n.replace("gamma", "γ"): (h["gamma_mean"] - h["gamma_std"],
                                                         h["gamma_mean"] + h["gamma_std"])
                               for n, h in first.items()},
                        ax=axes[0], xlabel="epoch", ylabel="γ (mean ± std over test images)")
    for (name, s), h in gamma_hist.items():
        axes[1].plot(h["epoch"], h["gamma_std"], color="C0" if name == SECE else "C1",
                     alpha=0.8, marker="o", markersize=2,
                     label=name.replace("gamma", "γ") if s == seed else None)
    axes[1].set(xlabel="epoch", ylabel="std of γ over test images")
    axes[1].legend(fontsize=8)
    for ax in axes:
        for e in milestone_epochs(epochs):
            ax.axvline(e, color="grey", linestyle=":", linewidth=1)
    fig.tight_layout()
    return fig


def late_gamma_glue(gamma_hist: Mapping[tuple[str, int], pd.DataFrame], seeds: Sequence[int],
                    epochs: int) -> dict[str, Any]:
    """Per learned-gamma method, the growth of gamma's std over the late phase (after the
    last epoch minus after the epoch of the first decay, t-interval over seeds) and the
    mean gamma after the last epoch (mean over seeds)."""
    late_start = milestone_epochs(epochs)[0]
    out: dict[str, Any] = {"ch05_late_start": late_start}
    for name, key in ((SECE, "sece"), (DECE, "dece")):
        late = metrics.seed_interval([
            float(gamma_hist[(name, s)]["gamma_std"].iloc[-1]
                  - gamma_hist[(name, s)]["gamma_std"].iloc[late_start - 1]) for s in seeds])
        out[f"ch05_late_{key}"] = late.estimate
        out[f"ch05_late_{key}_low"] = late.low
        out[f"ch05_late_{key}_high"] = late.high
        out[f"ch05_gamma_mean_last_{key}"] = float(np.mean(
            [gamma_hist[(name, s)]["gamma_mean"].iloc[-1] for s in seeds]))
    return out


def gamma_by_epoch(gamma_hist: Mapping[tuple[str, int], pd.DataFrame], seeds: Sequence[int]
                   ) -> pd.DataFrame:
    """Mean and std of gamma by epoch, each averaged over ``seeds``, per method."""
    return pd.concat(
        {name: pd.concat([gamma_hist[(name, s)].set_index("epoch")[["gamma_mean", "gamma_std"]]
                          for s in seeds]).groupby(level=0).mean()
         for name in (SECE, DECE)}, axis=1)


def pace(phases: pd.DataFrame) -> pd.Series:
    """Per learning-rate phase, the mean absolute change of gamma per epoch."""
    return phases.groupby(level="phase")["change per epoch"].apply(
        lambda v: float(v.abs().mean()))


def pace_glue(phases: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any]:
    """Gamma's pace in the first and the last phase, and the meta steps after the first
    decay, ours and the reference's."""
    by_phase = pace(phases)
    return {"ch05_pace_first": by_phase.iloc[0], "ch05_pace_last": by_phase.iloc[-1],
            "ch05_steps_ours_late": int(steps[("ours", "meta steps")].iloc[1:].sum()),
            "ch05_steps_ref_late": int(steps[("reference (CIFAR-10)", "meta steps")]
                                       .iloc[1:].sum())}


GAMMA_KEYS = ("right", "wrong", "auroc", "spread", "diff", "err_stored", "err_network",
              "mean_network", "mean_stored")


def gamma_check(test_gamma: Any, summary: Mapping[str, float], seed: int) -> pd.DataFrame:
    """Whether the network read back reproduces the stored logits, and both test errors."""
    return pd.Series({"network reproduces the stored logits": test_gamma.reproduces,
                      "largest logit difference": round(summary["diff"], 4),
                      "test error, stored run (%)": round(summary["err_stored"], 2),
                      "test error, network read (%)": round(summary["err_network"], 2)},
                     name=f"seed {seed}").to_frame()


def gamma_sensitivity(gamma_value: float, p_y: torch.Tensor) -> torch.Tensor:
    r""":math:`|\partial^2 \mathrm{FL} / \partial\gamma\, \partial z_y|` of the focal loss
    :math:`\mathrm{FL} = -(1 - p)^\gamma \log p` of a two-class sample whose true class has
    probability ``p_y`` (margin :math:`m = \log(p_y / (1 - p_y))`, :math:`p = \sigma(m)`)."""
    if not isinstance(p_y, torch.Tensor) or p_y.ndim != 1:
        raise TypeError("p_y must be a 1-d torch tensor")
    margin = torch.log(p_y / (1 - p_y)).requires_grad_(True)  # softmax([m, 0])[0] = p_y
    gamma = torch.tensor(gamma_value, dtype=torch.float64, requires_grad=True)
    p = torch.sigmoid(margin)
    loss = (-(1 - p) ** gamma * torch.log(p)).sum()
    (dz,) = torch.autograd.grad(loss, margin, create_graph=True)
    return torch.stack([torch.autograd.grad(dz[i], gamma, retain_graph=True)[0].abs()
                        for i in range(len(p_y))]).detach()


def sensitivity_figure(gamma_hist: Mapping[tuple[str, int], pd.DataFrame],
                       seeds: Sequence[int]) -> Any:
    """Left: :func:`gamma_sensitivity` against :math:`1 - p_y` at three gammas; right:
    FLγ-SECE's training accuracy by epoch, every seed."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    p_y = 1 - torch.logspace(-3, np.log10(0.95), 300, dtype=torch.float64)
    x: Any = (1 - p_y).numpy()
    curves: dict[str, Any] = {f"$\\gamma$ = {g}": gamma_sensitivity(g, p_y).numpy()
                              for g in (0.2, 1.0, 3.0)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    plots.metric_curves(x, curves, ax=axes[0], logx=True, xlabel="$1 - p_y$ of a training sample",
                        ylabel=r"$|\partial^2 \mathrm{FL} / \partial\gamma\, \partial z_y|$")
    for line in axes[0].get_lines():
        line.set_marker("")
    axes[0].legend(fontsize=8)  # redrawn without the markers
    for s in seeds:
        h = gamma_hist[(SECE, s)]
        axes[1].plot(h["epoch"], 100 * h["train_acc"], marker="o", markersize=2, color="C0",
                     alpha=0.8, label="FLγ-SECE" if s == seeds[0] else None)
    axes[1].set(xlabel="epoch", ylabel="training accuracy (%)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def meta_loop_figure() -> Any:
    """The bilevel loop of FLγ-SECE drawn as a flow diagram: the backbone's focal loss with
    gamma-Net's per-sample gamma, the look-ahead step of the head, SECE on the
    meta-validation batch, the Adam step of gamma-Net through the look-ahead, then the real
    step of the backbone with the new, fixed gamma."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    fig, ax = plt.subplots(figsize=(10, 5.2))
    plots.flow_diagram(
        {"train": (0.07, 0.82, "training batch\n$B_t = \\{(x_i, y_i)\\}$"),
         "backbone": (0.28, 0.82, "backbone $\\theta_t$\nfeatures $f(x_i)$, logits $z_i$"),
         "gamma": (0.28, 0.45, "gamma-Net $\\phi_t$\n"
                              "$\\gamma_i = |\\pi(f A) A^\\top W| / \\tau$"),
         "focal": (0.53, 0.82, "focal loss\n$\\sum_i \\mathrm{FL}_{\\gamma_i}(z_i, y_i)$"),
         "ahead": (0.85, 0.82, "look-ahead (head only)\n$\\theta' = \\theta_t - \\eta_t "
                              "\\nabla_\\theta \\sum_i \\mathrm{FL}$"),
         "sece": (0.85, 0.45, "outer loss\n$\\mathrm{SECE}(\\theta'(\\phi); M_t)$"),
         "meta": (0.85, 0.1, "meta-validation batch\n$M_t$ (held out)"),
         "adam": (0.56, 0.45, "Adam step of $\\phi$\n"
                             "on $\\partial\\,\\mathrm{SECE} / \\partial\\phi$"),
         "real": (0.28, 0.1, "real step of $\\theta$: SGD on\n"
                            "$\\mathrm{FL}$ with the new $\\gamma$")},
        [("train", "backbone", "", 0.0),
         ("backbone", "gamma", "$f(x_i)$, detached", 0.0),
         ("backbone", "focal", "$z_i$", 0.0),
         ("gamma", "focal", "$\\gamma_i(\\phi)$", 0.0),
         ("focal", "ahead", "$\\nabla_\\theta$", 0.0),
         ("ahead", "sece", "$\\theta'(\\phi)$", 0.0),
         ("meta", "sece", "", 0.0),
         ("sece", "adam", "backward\nthrough $\\theta'$", 0.0),
         ("adam", "gamma", "$\\phi_{t+1}$", 0.0),
         ("gamma", "real", "new $\\gamma_i$, fixed", 0.0),
         ("real", "backbone", "$\\theta_{t+1}$", -0.6)],
        ax=ax, fontsize=8.5,
        colors={"gamma": "#fde9c9", "adam": "#fde9c9", "sece": "#dce9f7", "ahead": "#dce9f7",
                "meta": "#dce9f7"})
    return fig
