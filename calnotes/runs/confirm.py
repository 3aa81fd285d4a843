"""A confirmatory round: the spread of each exploratory claim over its stored seeds, the
number of fresh seeds that detects a smallest effect of interest, and its cost.

For a claim tested over seeds (paired arms or one arm), the replicate is one seed's value
``d_s`` of the claim's statistic (the paired difference ``a_s - b_s`` for two arms), in the
claim's shown units (times its ``scale``). Its sample SD ``s`` and a smallest effect of
interest ``Δ`` give the seeds of the confirmatory replication:

    n = min { n >= 2 : power_t(Δ, s, n, α) >= 0.8 },   α = 0.05 / m  (Holm's first step
    over a family of m claims: the level every member is sure to be tested at),

computed exactly with the noncentral t (:func:`calnotes.stats.seeds_for_power`). A seed's
cost is the training seconds its runs took, read from the stored runs' provenance.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from calnotes import stats as st
from calnotes.runs import claims as cl
from calnotes.runs.claims import _effect
from calnotes.runs.store import RunStore, StoredRun, config_hash

__all__ = ["Plan", "arm_seed_cost", "claim_seed_values", "confirmatory_configs", "plan_claim",
           "shared_seeds", "study_values"]


def _claim(spec: Mapping[str, Any], cid: str) -> Mapping[str, Any]:
    for c in spec["claims"]:
        if c["id"] == cid:
            return c
    raise ValueError(f"{spec['path']}: no claim {cid!r}")


def _arm_test_runs(spec: Mapping[str, Any], cid: str,
                   store: RunStore | None) -> tuple[Mapping[str, Any], dict[int, StoredRun],
                                                    dict[int, StoredRun] | None]:
    c = _claim(spec, cid)
    t = c.get("test")
    if t is None or "a" not in t:
        raise ValueError(f"{spec['path']}: claim {cid!r} is not tested on arms of stored runs")
    if t["design"] == "bootstrap":
        raise ValueError(f"{spec['path']}: claim {cid!r} bootstraps one run's test set: it has "
                         f"no spread over seeds")
    runs_a = cl.arm_runs(spec, t["a"], store)
    runs_b = cl.arm_runs(spec, t["b"], store) if "b" in t else None
    return t, runs_a, runs_b


def claim_seed_values(spec: Mapping[str, Any], cid: str, store: RunStore | None = None,
                      seeds: Sequence[int] | None = None) -> dict[int, float]:
    """``{seed: d_s}``: the claim's statistic per stored seed (only ``seeds`` if given), in
    its shown units (the paired effect for two arms), as the evaluator computes it."""
    t, runs_a, runs_b = _arm_test_runs(spec, cid, store)

    def options(arm: str) -> dict[str, Any]:
        return {**t["options"], **(spec["arms"][arm].get("options") or {})}

    paired = set(runs_a) if runs_b is None else set(runs_a) & set(runs_b)
    if seeds is not None:
        paired &= {int(s) for s in seeds}
    out: dict[int, float] = {}
    for s in sorted(paired):
        a = cl.run_measure(t["statistic"], runs_a[s], **options(t["a"]))
        b = None if runs_b is None else cl.run_measure(t["statistic"], runs_b[s],
                                                         **options(t["b"]))
        out[s] = float(t["scale"]) * _effect(a, b, t["effect"])
    return out


def arm_seed_cost(spec: Mapping[str, Any], arm: str, store: RunStore | None = None) -> float:
    """Mean training seconds of one run of an arm (from its stored runs' provenance)."""
    runs = cl.arm_runs(spec, arm, store)
    if not runs:
        raise ValueError(f"{spec['path']}: arm {arm!r} has no stored run to cost")
    return float(np.mean([float(r.provenance.get("seconds", math.nan))
                          for r in runs.values()]))


def shared_seeds(needs: Mapping[str, int], arms_of: Mapping[str, Sequence[str]]
                 ) -> tuple[dict[str, int], dict[str, int]]:
    """Seeds per arm and per claim when claims share arms: an arm gets the largest number
    any claim on it needs (its seeds are the first that many fresh ones), and a claim, which
    pairs its arms on their common seeds, the smallest of its arms' (never fewer than it
    needs). A claim on no arm keeps its own. Returns ``(claim seeds, arm seeds)``."""
    arms: dict[str, int] = {}
    for cid, names in arms_of.items():
        for arm in names:
            arms[arm] = max(arms.get(arm, 0), int(needs[cid]))
    claims = {cid: (min(arms[a] for a in arms_of[cid]) if arms_of.get(cid) else int(n))
              for cid, n in needs.items()}
    return claims, arms


@dataclass(frozen=True)
class Plan:
    """One claim's confirmatory design: its twin's spread, SESOI, seeds and power."""

    claim: str
    sesoi: float
    sd: float
    exploratory_seeds: int
    alpha: float
    needed: int
    reached: bool
    planned: int
    power_planned: float

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def plan_claim(values: Sequence[float], sesoi: float, alpha: float, cap: int,
               power: float = 0.8, floor: int = 4) -> Plan:
    """Seeds for one claim: the power-chosen ``n`` (at least ``floor``), capped at ``cap``;
    ``power_planned`` is the exact power at ``sesoi`` with the planned seeds."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"values must hold at least two seeds, got {x.size}")
    if not (isinstance(sesoi, (int, float)) and math.isfinite(sesoi) and sesoi > 0):
        raise ValueError(f"sesoi must be a finite positive number, got {sesoi!r}")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 2:
        raise ValueError(f"cap must be an int of at least 2, got {cap!r}")
    sd = float(x.std(ddof=1))
    if not sd > 0:
        raise ValueError("values have no spread: the power of a t test is undefined")
    need = st.seeds_for_power(sesoi, sd, alpha, power)
    planned = min(max(need.n, floor), cap)
    return Plan("", float(sesoi), sd, int(x.size), alpha, need.n, need.reached, planned,
                st.power_t(sesoi, sd, planned, alpha))


def study_values(spec: Mapping[str, Any], cid: str, **overrides: Any) -> np.ndarray:
    """The replicates (draws, rounds or seeds) of a claim tested by a registered study, with
    ``overrides`` applied to its options (e.g. a fresh ``seed``)."""
    t = _claim(spec, cid).get("test")
    if t is None or "study" not in t:
        raise ValueError(f"{spec['path']}: claim {cid!r} is not tested by a study")
    if t["study"] not in cl.STUDIES:
        raise ValueError(f"{spec['path']}: claim {cid!r}: unknown study {t['study']!r}")
    values = cl.STUDIES[t["study"]](**{**t["options"], **overrides})
    return float(t["scale"]) * np.asarray(values, dtype=np.float64).ravel()


def confirmatory_configs(spec: Mapping[str, Any], cid: str, seeds: Sequence[int],
                         store: RunStore | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(label, config)`` of every run that claim ``cid``'s arms need at ``seeds``: each
    arm's stored config of its smallest seed with the seed replaced (the regime, recipe and
    selection unchanged), and, where the claim reads a deep ensemble, its other members."""
    from calnotes.runs import shift

    t, runs_a, runs_b = _arm_test_runs(spec, cid, store)
    opts = t["options"]
    out: list[tuple[str, dict[str, Any]]] = []
    for runs in (runs_a, runs_b):
        if runs is None:
            continue
        template = runs[min(runs)]
        label = str(template.label)
        for seed in seeds:
            config = {**template.config, "seed": int(seed)}
            out.append((label, config))
            versus = opts.get("versus")
            if versus is not None:  # a chapter-6 comparison with another method's run
                out.append((label, shift.method_config(versus, config, int(seed))))
            if opts.get("post") == "ensemble" or versus == "Ensemble":
                out += [(label, m) for m in shift.ensemble_configs(config, int(seed))[1:]]
    unique: dict[str, tuple[str, dict[str, Any]]] = {}
    for label, config in out:
        unique.setdefault(config_hash(config), (label, config))
    return list(unique.values())
