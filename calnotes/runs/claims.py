"""Claims as data: a chapter's claims file, the stored runs that answer each claim, and one
evaluator that turns them into evidence and a verdict.

A claims file (YAML, one per chapter) declares named **arms** (a selection of stored runs,
one per seed) and **claims**, each with its test: the arms compared, the statistic (a
registered *measure* of a stored run, or a registered *study* that returns replicate
values), the effect (``a - b``, ``(a - b) / b`` or ``log(a / b)``), the claimed direction,
and the effect the work reports. :func:`evaluate_claims` chooses the design:

- two arms that share each seed's data split: a **paired** Student-t interval on the
  per-seed effects; arms that do not: **Welch** on the per-seed values (said as such);
- ``design: bootstrap``: the test-set **bootstrap**, the same resampled test indices for
  both arms; where the arms hold several seeds, **hierarchical**: seeds resampled first,
  then test samples within each drawn seed; a single run's interval is conditional on that
  one trained network; one seed without it has no interval (inconclusive);
- a study: a one-sample t interval over its replicates;

and the claim's own verdict (:func:`calnotes.stats.verdict`), with its two-sided p-value
against ``null`` (for the book-wide multiplicity adjustment,
:func:`calnotes.runs.verdicts.adjust_verdicts`). A premise (another claim) that fails or is
inconclusive is noted beside the verdict (``premise_state``), never in its place. A claim
reading a run that did not train (:func:`calnotes.runs.verdicts.did_not_train`) is ``not
testable: the method did not train here``; one declared without stored runs says
``declared; no runs yet``. ``margin`` declares a non-inferiority test (the effect lies on
the claimed side of the margin), and a ``paper`` value on the other side of ``null`` is
refused at load.

An arm may name a **selection rule** (``rule: NAME``, registered with :func:`register_rule`)
that a chapter declared before its runs, e.g. the number of epochs chosen on validation data:
the rule reads the store and returns config keys that join the arm's ``where``. The claim's
definition names the rule, not its outcome, so a rule applied after it was declared keeps
the claim "before its runs"; while the rule's candidates are not stored the claim waits.
"""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes import stats as st
from calnotes.calibrators import TemperatureScaling
from calnotes.runs.claims_file import nonfinite, read_claims_yaml
from calnotes.runs.store import CorruptRun, RunNotFound, RunStore, StoredRun
from calnotes.runs.verdicts import did_not_train, premise_note, premise_state

__all__ = [
    "CLAIM_FIELDS", "MEASURES", "PHASES", "RULES", "STUDIES", "SPLIT_KEYS", "TABLE_COLUMNS",
    "arm_runs",
    "evaluate_claims",
    "load_claims", "register_measure", "register_rule", "register_study", "run_measure",
    "under_way_text",
]

Measure = Callable[..., float]
Study = Callable[..., Any]
Rule = Callable[[RunStore], Mapping[str, Any]]
#: Registered measures: ``name -> f(run, index=None, **options) -> float``.
MEASURES: dict[str, Measure] = {}
#: Registered studies: ``name -> f(**options) -> 1-D array of replicate effect values``.
STUDIES: dict[str, Study] = {}
#: Selection rules of arms: ``f(store) -> {dotted config key: value}``.
RULES: dict[str, Rule] = {}
#: Config keys that define a seed's data split: arms agreeing on them can be paired.
SPLIT_KEYS = ("dataset", "train_subset", "val_size", "test_subset", "seed")
CLAIM_FIELDS = ("id", "claim", "original", "work", "where", "premise", "key", "test",
                "not_testable", "question", "phase", "twin", "sesoi", "planned_seeds")
#: A claim's phase: exploratory (the default) or confirmatory (declared, with its sesoi and
#: planned seeds, before the runs that test it; its own multiplicity family).
PHASES = ("exploratory", "confirmatory")
#: Most bootstrap resamples a claim may ask for (each one recomputes its measure).
MAX_RESAMPLES = 100_000
TEST_FIELDS = ("a", "b", "statistic", "study", "options", "effect", "scale", "unit",
               "direction", "null", "paper", "design", "resamples", "margin")
ARM_FIELDS = ("label", "where", "seeds", "options", "rule")
TABLE_COLUMNS = ("id", "claim", "original", "work", "where", "premise", "key", "design", "n",
                 "estimate", "low", "high", "detectable", "paper", "null", "direction",
                 "unit", "verdict", "declared", "evidence", "question", "phase", "twin",
                 "sesoi", "planned_seeds", "verdict_raw", "premise_state", "p", "p_adjusted",
                 "adjusted", "n_seeds", "margin", "quantity", "under_way")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def register_measure(name: str) -> Callable[[Measure], Measure]:
    """Decorator: register ``f(run, index=None, **options) -> float`` as measure ``name``."""
    def wrap(f: Measure) -> Measure:
        MEASURES[name] = f
        return f
    return wrap


def register_study(name: str) -> Callable[[Study], Study]:
    """Decorator: register ``f(**options) -> replicate values`` as study ``name``."""
    def wrap(f: Study) -> Study:
        STUDIES[name] = f
        return f
    return wrap


def register_rule(name: str) -> Callable[[Rule], Rule]:
    """Decorator: register ``f(store) -> {config key: value}`` as the selection rule
    ``name`` an arm may name; it raises :class:`~calnotes.runs.store.RunNotFound` while
    the runs it chooses among are not stored."""
    def wrap(f: Rule) -> Rule:
        RULES[name] = f
        return f
    return wrap


# --- the claims file ---------------------------------------------------------------------

def _fail(path: Path, where: str, problem: str) -> ValueError:
    return ValueError(f"{path}: {where}: {problem}")


def _null_key(test: Any) -> Any:
    """A test mapping with YAML's key ``null:`` (read as None) spelled ``"null"``."""
    if isinstance(test, dict) and None in test:
        return {("null" if k is None else k): v for k, v in test.items()}
    return test


def _check_keys(path: Path, where: str, entry: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(entry, dict):
        raise _fail(path, where, f"must be a mapping, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(allowed))
    if unknown:
        raise _fail(path, where, f"unknown field(s) {unknown}; allowed: {', '.join(allowed)}")


def _check_test(path: Path, cid: str, test: Any, arms: Mapping[str, Any]) -> dict[str, Any]:
    where = f"claim {cid!r}, test"
    test = _null_key(test)
    _check_keys(path, where, test, TEST_FIELDS)
    t = dict(test)
    if ("study" in t) == ("a" in t):
        raise _fail(path, where, "give either a study or an arm a (with a statistic)")
    if "a" in t:
        for arm in ("a", "b"):
            if arm in t and t[arm] not in arms:
                raise _fail(path, where, f"{arm} names no arm: {t[arm]!r}")
        if t.get("statistic") is None:
            raise _fail(path, where, "an arm test needs a statistic (a measure name)")
    elif t["study"] is None:
        raise _fail(path, where, "study must name a registered study")
    if t.get("direction") not in ("below", "above"):
        raise _fail(path, where, f"direction must be 'below' or 'above', got "
                                 f"{t.get('direction')!r}")
    t.setdefault("effect", "difference")
    if t["effect"] not in ("difference", "relative", "log_ratio"):
        raise _fail(path, where, f"effect must be difference, relative or log_ratio, got "
                                 f"{t['effect']!r}")
    if t["effect"] != "difference" and "b" not in t:
        raise _fail(path, where, f"effect {t['effect']!r} needs an arm b")
    t.setdefault("design", "auto")
    if t["design"] not in ("auto", "welch", "bootstrap"):
        raise _fail(path, where, f"design must be auto, welch or bootstrap, got "
                                 f"{t['design']!r}")
    if "margin" in t:  # non-inferiority: the effect lies on the claimed side of the margin
        margin = t["margin"]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not (
                math.isfinite(margin)) or margin == 0:
            raise _fail(path, where, f"margin must be a finite non-zero number, got "
                                     f"{margin!r}")
        if "null" in t and t["null"] != margin:
            raise _fail(path, where, "give a margin (non-inferiority) or a null, not both")
        if (margin > 0) != (t["direction"] == "below"):
            raise _fail(path, where, f"a non-inferiority margin lies on the side the effect "
                                     f"must not reach: below needs a positive margin, above "
                                     f"a negative one; got {margin} with {t['direction']}")
        t["null"] = margin
    for name, default in (("scale", 1.0), ("null", 0.0), ("resamples", 2000)):
        t.setdefault(name, default)
        if isinstance(t[name], bool) or not isinstance(t[name], (int, float)) or not (
                math.isfinite(t[name])):
            raise _fail(path, where, f"{name} must be a finite number, got {t[name]!r}")
    if t["scale"] <= 0:
        raise _fail(path, where, f"scale must be positive, got {t['scale']}")
    if int(t["resamples"]) < 100:
        raise _fail(path, where, f"resamples must be at least 100, got {t['resamples']}")
    if t["resamples"] != int(t["resamples"]) or t["resamples"] > MAX_RESAMPLES:
        raise _fail(path, where, f"resamples must be a whole number at most {MAX_RESAMPLES} "
                                 f"(the limit), got {t['resamples']}")
    paper = t.get("paper")
    if paper is not None and (isinstance(paper, bool) or not isinstance(paper, (int, float))
                              or not math.isfinite(paper)):
        raise _fail(path, where, f"paper must be a finite number, got {paper!r}")
    if paper is not None and paper != t["null"] and (paper < t["null"]) != (
            t["direction"] == "below"):
        raise _fail(path, where, f"the reported effect paper = {paper:+g} lies on the other "
                                 f"side of null = {t['null']:+g} from the claimed direction "
                                 f"({t['direction']}): test the work's own statement (e.g. "
                                 f"non-inferiority with a margin)")
    t.setdefault("options", {})
    if not isinstance(t["options"], dict):
        raise _fail(path, where, "options must be a mapping")
    bad = nonfinite(t["options"])
    if bad:
        raise _fail(path, where, f"options: {bad}")
    t.setdefault("unit", "")
    return t


def load_claims(path: str | Path) -> dict[str, Any]:
    """Read and validate a claims file: ``{"chapter", "path", "arms", "claims"}``.

    Every problem is a ``ValueError`` naming the file and the claim or arm.
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a path, got {type(path).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no claims file at {path}")
    data = read_claims_yaml(path)  # size, depth, alias and duplicate-key limits, UTF-8
    _check_keys(path, "top level", data, ("chapter", "arms", "claims"))
    arms = data.get("arms") or {}
    if not isinstance(arms, dict):
        raise _fail(path, "arms", "must be a mapping of names to selections")
    for name, arm in arms.items():
        _check_keys(path, f"arm {name!r}", arm, ARM_FIELDS)
        if "label" not in arm:
            raise _fail(path, f"arm {name!r}", "needs the label its runs were stored under")
        label = arm["label"]
        if not (isinstance(label, str) and label.strip()) and not (
                isinstance(label, list) and label
                and all(isinstance(x, str) and x.strip() for x in label)):
            raise _fail(path, f"arm {name!r}", f"label must be a label or a non-empty list of "
                                               f"labels (strings), got {label!r}")
        bad = nonfinite(arm.get("where")) or nonfinite(arm.get("options"))
        if bad:
            raise _fail(path, f"arm {name!r}", bad)
        if not isinstance(arm.get("where", {}), dict):
            raise _fail(path, f"arm {name!r}", "where must be a mapping of config keys")
        if not isinstance(arm.get("options", {}), dict):
            raise _fail(path, f"arm {name!r}", "options must be a mapping of measure options")
        if "rule" in arm and (not isinstance(arm["rule"], str) or not arm["rule"].strip()):
            raise _fail(path, f"arm {name!r}", f"rule must name a selection rule, got "
                                               f"{arm['rule']!r}")
        seeds = arm.get("seeds")
        if seeds is not None and (not isinstance(seeds, list) or not seeds or not all(
                isinstance(x, int) and not isinstance(x, bool) for x in seeds)):
            raise _fail(path, f"arm {name!r}", f"seeds must be a non-empty list of ints, got "
                                               f"{seeds!r}")
    claims = data.get("claims")
    if not isinstance(claims, list) or not claims:
        raise _fail(path, "claims", "must be a non-empty list")
    seen: dict[str, dict[str, Any]] = {}
    for i, entry in enumerate(claims):
        _check_keys(path, f"claims[{i}]", entry, CLAIM_FIELDS)
        cid = entry.get("id")
        if not isinstance(cid, str) or not _ID.match(cid):
            raise _fail(path, f"claims[{i}]", f"id must be lowercase letters, digits and "
                                              f"'-', got {cid!r}")
        if cid in seen:
            raise _fail(path, f"claim {cid!r}", "id used twice")
        for field in ("claim", "work", "where"):
            if not isinstance(entry.get(field), str) or not entry[field].strip():
                raise _fail(path, f"claim {cid!r}", f"{field} must be a non-empty string")
        for field in ("original", "not_testable", "premise"):
            if field in entry and (not isinstance(entry[field], str)
                                   or not entry[field].strip()):
                raise _fail(path, f"claim {cid!r}", f"{field} must be a non-empty string, "
                                                    f"got {type(entry[field]).__name__}")
        if ("test" in entry) == ("not_testable" in entry):
            raise _fail(path, f"claim {cid!r}", "give either a test or not_testable (why)")
        claim = dict(entry)
        _check_optional(path, cid, claim)
        if "test" in entry:
            claim["test"] = _check_test(path, cid, entry["test"], arms)
        seen[cid] = claim
    for cid, claim in seen.items():
        premise = claim.get("premise")
        if premise is not None and premise not in seen:
            raise _fail(path, f"claim {cid!r}", f"premise names no claim: {premise!r}")
    for cid, claim in seen.items():
        twin = claim.get("twin")
        if twin is None:
            continue
        if twin not in seen or twin == cid:
            raise _fail(path, f"claim {cid!r}", f"twin names no other claim of this file: "
                                                f"{twin!r}")
        if claim["phase"] != "confirmatory" or seen[twin]["phase"] != "exploratory":
            raise _fail(path, f"claim {cid!r}", f"a twin links a confirmatory claim to the "
                                                f"exploratory claim it replicates; here "
                                                f"{claim['phase']} -> {seen[twin]['phase']}")
    _check_premise_cycles(path, seen)
    return {"chapter": str(data.get("chapter", path.stem)), "path": path, "arms": arms,
            "claims": list(seen.values())}


def _check_optional(path: Path, cid: str, claim: dict[str, Any]) -> None:
    """Type and range of a claim's optional keys; ``phase`` defaults to exploratory."""
    where = f"claim {cid!r}"
    question = claim.get("question")
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise _fail(path, where, f"question must be a non-empty string, got {question!r}")
    key = claim.get("key", False)
    if not isinstance(key, bool):
        raise _fail(path, where, f"key must be true or false, got {key!r}")
    claim.setdefault("phase", "exploratory")
    if claim["phase"] not in PHASES:
        raise _fail(path, where, f"phase must be one of {', '.join(PHASES)}, got "
                                 f"{claim['phase']!r}")
    twin = claim.get("twin")
    if twin is not None and not isinstance(twin, str):
        raise _fail(path, where, f"twin must be a claim id, got {twin!r}")
    sesoi = claim.get("sesoi")
    if sesoi is not None and (isinstance(sesoi, bool) or not isinstance(sesoi, (int, float))
                              or not math.isfinite(sesoi) or sesoi <= 0):
        raise _fail(path, where, f"sesoi must be a finite positive number (the smallest "
                                 f"effect of interest, in the claim's units), got {sesoi!r}")
    seeds = claim.get("planned_seeds")
    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int)
                              or seeds < 1):
        raise _fail(path, where, f"planned_seeds must be a positive int, got {seeds!r}")


def _check_premise_cycles(path: Path, claims: Mapping[str, Mapping[str, Any]]) -> None:
    for cid in claims:
        chain, cur = [cid], claims[cid].get("premise")
        while cur is not None:
            if cur in chain:
                raise _fail(path, f"claim {cid!r}", f"premises form a cycle: {chain + [cur]}")
            chain.append(cur)
            cur = claims[cur].get("premise")


# --- arms: stored runs by seed -----------------------------------------------------------

def _get(config: Mapping[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _has(config: Mapping[str, Any], dotted: str) -> bool:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False
        value = value[part]
    return True


def _label_of(folder: Path) -> str | None:
    """The label in a stored run's provenance; a provenance that cannot be read is an error
    naming the run (its runs would otherwise drop out of their arms without a word)."""
    file = folder / "provenance.json"
    try:
        label = json.loads(file.read_text(encoding="utf-8")).get("label")
    except (OSError, ValueError, AttributeError) as err:
        raise CorruptRun(f"stored run {folder.name}: {file} cannot be read ({err}); delete "
                         f"the folder {folder} and recompute the run (`make results`)") from err
    if label is not None and not isinstance(label, str):
        raise CorruptRun(f"stored run {folder.name}: {file} has a label that is not a "
                         f"string: {label!r}")
    return label


class _Index:
    """Every run of a store, loaded once per evaluation."""

    def __init__(self, store: RunStore, labels: set[str]) -> None:
        self.store, self.labels = store, labels
        self._runs: list[StoredRun] | None = None

    @property
    def runs(self) -> list[StoredRun]:
        """The runs stored under one of ``labels`` (read from each provenance first, so
        that other chapters' runs are not loaded)."""
        if self._runs is None:
            self._runs = [self.store._load_folder(f) for f in self.store._folders()
                          if _label_of(f) in self.labels]
        return self._runs

    def arm(self, name: str, arm: Mapping[str, Any]) -> dict[int, StoredRun]:
        labels = arm["label"] if isinstance(arm["label"], list) else [arm["label"]]
        where = dict(arm.get("where") or {})
        if "rule" in arm:
            if arm["rule"] not in RULES:
                raise ValueError(f"arm {name!r}: unknown selection rule {arm['rule']!r}; "
                                 f"registered: {', '.join(sorted(RULES)) or 'none'}")
            try:
                where.update(RULES[arm["rule"]](self.store))
            except RunNotFound as missing:
                raise _NoRuns(f"arm {name!r}: its rule {arm['rule']!r} cannot choose yet "
                              f"({missing})") from missing
        seeds = arm.get("seeds")
        mine = [run for run in self.runs if run.label in labels]
        for key in where:
            if mine and not any(_has(run.config, key) for run in mine):
                raise ValueError(f"arm {name!r}: where names {key!r}, which no stored config "
                                 f"of label(s) {', '.join(labels)} has (a config key, dotted "
                                 f"for nested keys, e.g. loss_options.gamma)")
        out: dict[int, StoredRun] = {}
        for run in self.runs:
            if run.label not in labels:
                continue
            if any(_get(run.config, k) != v for k, v in where.items()):
                continue
            seed = int(run.config.get("seed", 0))
            if seeds is not None and seed not in seeds:
                continue
            if seed in out:
                raise ValueError(
                    f"arm {name!r} selects two runs of seed {seed} ({out[seed].path.name} and "
                    f"{run.path.name}): add a 'where' key that tells them apart")
            out[seed] = run
        return out


def arm_runs(spec: Mapping[str, Any] | str | Path, name: str,
             store: RunStore | None = None) -> dict[int, StoredRun]:
    """The stored runs ``{seed: run}`` that arm ``name`` of a claims file (its path, or what
    :func:`load_claims` returned) selects, as the evaluator selects them."""
    spec = spec if isinstance(spec, Mapping) else load_claims(spec)
    if name not in spec["arms"]:
        raise ValueError(f"{spec['path']}: no arm {name!r}; arms: {', '.join(spec['arms'])}")
    arm = spec["arms"][name]
    labels = set(arm["label"] if isinstance(arm["label"], list) else [arm["label"]])
    return _Index(RunStore() if store is None else store, labels).arm(name, arm)


# --- measures that ship with the evaluator -----------------------------------------------

_TEMPERATURES: dict[Path, float] = {}
#: Option names of the claims files that the library spells otherwise.
_ALIASES = {"bins": "n_bins"}
_BINNINGS = {"width": "uniform", "mass": "quantile"}


def _val_temperature(run: StoredRun) -> float:
    """Temperature scaling's T fitted (NLL) on the run's validation logits, once per run."""
    if run.path not in _TEMPERATURES:
        if run.val_logits is None or run.val_labels is None:
            raise ValueError(f"run {run.path.name} stores no validation logits to fit a "
                             f"temperature on")
        ts = TemperatureScaling().fit(run.val_logits.double(), run.val_labels)
        _TEMPERATURES[run.path] = float(ts.temperature_)
    return _TEMPERATURES[run.path]


def _library_options(options: Mapping[str, Any]) -> dict[str, Any]:
    out = {_ALIASES.get(k, k): v for k, v in options.items()}
    if "binning" in out:
        out["binning"] = _BINNINGS.get(out["binning"], out["binning"])
    return out


def _probs(run: StoredRun, index: Any, temperature: Any) -> tuple[torch.Tensor, torch.Tensor]:
    logits, labels = run.test_logits.double(), run.test_labels
    if temperature == "val":
        if run.val_logits is None:
            raise ValueError(f"run {run.path.name} stores no validation logits to fit a "
                             f"temperature on")
        logits = logits / _val_temperature(run)
    elif temperature is not None:
        raise ValueError(f"temperature must be None or 'val', got {temperature!r}")
    if index is not None:
        logits, labels = logits[index], labels[index]
    return torch.softmax(logits, dim=1), labels


def _computed(name: str) -> Measure:
    def measure(run: StoredRun, index: Any = None, temperature: Any = None,
                **options: Any) -> float:
        probs, labels = _probs(run, index, temperature)
        if name == "confidence_gap":
            conf, pred = probs.max(dim=1)
            return float(conf.mean() - (pred == labels).double().mean())
        return float(getattr(metrics, name)(probs, labels, **_library_options(options)))
    measure.__name__ = name
    measure.__doc__ = (f"{name} of the run's test predictions (``temperature='val'``: after "
                       f"temperature scaling fitted on its validation logits).")
    return measure


for _name in ("error", "nll", "brier", "ece", "mce", "sece", "confidence_gap"):
    MEASURES[_name] = _computed(_name)


def run_measure(name: str, run: StoredRun, index: Any = None, **options: Any) -> float:
    """Measure ``name`` of ``run``: a registered measure, else a key of its metrics.json
    (which cannot be resampled: ``index`` must then be None)."""
    if name in MEASURES:
        return float(MEASURES[name](run, index=index, **options))
    if name in run.metrics:
        if index is not None or options:
            raise ValueError(f"measure {name!r} is a stored number of {run.path.name}: it "
                             f"takes no options and cannot be bootstrapped")
        return float(run.metrics[name])
    raise ValueError(f"unknown measure {name!r}: register it (register_measure) or name a "
                     f"key of metrics.json")


class _NoRuns(LookupError):
    """A declared arm with no stored run yet: the claim is reported, not evaluated."""


# --- evaluation --------------------------------------------------------------------------

def _effect(a: float, b: float | None, kind: str) -> float:
    if b is None:
        return a
    if kind == "difference":
        return a - b
    if kind == "relative":
        return (a - b) / b
    return math.log(a / b)


def _paired(runs_a: Mapping[int, StoredRun], runs_b: Mapping[int, StoredRun]) -> bool:
    return all(all(_get(runs_a[s].config, k) == _get(runs_b[s].config, k) for k in SPLIT_KEYS)
               for s in runs_a)


HIERARCHICAL = "hierarchical bootstrap (seeds, then test samples)"


def _bootstrap(test: Mapping[str, Any], pairs: list[tuple[StoredRun, StoredRun | None]],
               opts_a: Mapping[str, Any], opts_b: Mapping[str, Any]) -> st.Effect:
    """Test-set bootstrap of one seed's runs (the same resampled indices for both arms);
    with several seeds, hierarchical: each replicate resamples the seeds, then each drawn
    seed's test samples, and averages the seeds' effects."""
    for run_a, run_b in pairs:
        if run_b is not None and not torch.equal(run_b.test_labels, run_a.test_labels):
            raise ValueError(f"runs {run_a.path.name} and {run_b.path.name} were tested on "
                             f"other test sets: they cannot be bootstrapped together")
    stat = test["statistic"]

    def effect(j: int, index: Any) -> float:
        run_a, run_b = pairs[j]
        a = run_measure(stat, run_a, index=index, **opts_a)
        b = None if run_b is None else run_measure(stat, run_b, index=index, **opts_b)
        return _effect(a, b, test["effect"])

    sizes = [int(a.test_labels.shape[0]) for a, _ in pairs]
    rng = np.random.default_rng(0)
    k = len(pairs)
    if k == 1:
        n = sizes[0]
        reps = [effect(0, torch.from_numpy(rng.integers(0, n, n)))
                for _ in range(int(test["resamples"]))]
        return st.bootstrap_effect(effect(0, None), reps, n)
    reps = []
    for _ in range(int(test["resamples"])):
        drawn = rng.integers(0, k, k)
        reps.append(float(np.mean([effect(int(j), torch.from_numpy(
            rng.integers(0, sizes[j], sizes[j]))) for j in drawn])))
    estimate = float(np.mean([effect(j, None) for j in range(k)]))
    eff = st.bootstrap_effect(estimate, reps, k)
    return st.Effect(eff.estimate, eff.low, eff.high, k, HIERARCHICAL, eff.se, eff.detectable)


class _NotTrained(LookupError):
    """An arm's run that did not train (:func:`calnotes.runs.verdicts.did_not_train`)."""


_TRAINED: dict[Path, str | None] = {}


def _check_trained(runs: list[StoredRun]) -> None:
    for run in runs:
        if run.path not in _TRAINED:
            try:
                logits, labels = run.test_logits, run.test_labels
            except (OSError, ValueError, KeyError):
                logits = None
            _TRAINED[run.path] = (None if logits is None or labels is None
                                  else did_not_train(logits, labels))
        if _TRAINED[run.path]:
            raise _NotTrained(f"run {run.path.name} ({run.label}, seed "
                              f"{run.config.get('seed', 0)}) did not train: "
                              f"{_TRAINED[run.path]}")


def _arm_effect(spec: Mapping[str, Any], test: Mapping[str, Any], index: _Index,
                seeds_used: list[int]) -> tuple[st.Effect, list[StoredRun]]:
    arms = spec["arms"]
    runs_a = index.arm(test["a"], arms[test["a"]])
    runs_b = index.arm(test["b"], arms[test["b"]]) if "b" in test else None
    if not runs_a or (runs_b is not None and not runs_b):
        empty = test["a"] if not runs_a else test["b"]
        raise _NoRuns(f"no stored run of arm {empty!r} yet: the claim waits for its runs "
                      f"(make results)")
    opts_a = {**test["options"], **(arms[test["a"]].get("options") or {})}
    opts_b = {} if runs_b is None else {**test["options"], **(arms[test["b"]].get("options")
                                                              or {})}
    stat, kind = test["statistic"], test["effect"]
    _check_trained(list(runs_a.values()) + list((runs_b or {}).values()))
    if runs_b is None:
        seeds = sorted(runs_a)
        used = [runs_a[s] for s in seeds]
        if test["design"] == "bootstrap":
            seeds_used.extend(seeds)
            return _bootstrap(test, [(r, None) for r in used], opts_a, {}), used
        values = [run_measure(stat, r, **opts_a) for r in used]
        seeds_used.extend(seeds)
        return st.one_sample_effect(values, design="one-sample t over seeds"), used
    common = sorted(set(runs_a) & set(runs_b))
    if test["design"] == "bootstrap":
        if not common:
            raise ValueError(f"{spec['path']}: arms {test['a']!r} and {test['b']!r} share no "
                             f"seed to bootstrap")
        seeds_used.extend(common)
        return (_bootstrap(test, [(runs_a[s], runs_b[s]) for s in common], opts_a, opts_b),
                [runs_a[s] for s in common] + [runs_b[s] for s in common])
    if test["design"] == "auto" and common and _paired(
            {s: runs_a[s] for s in common}, {s: runs_b[s] for s in common}):
        a = [run_measure(stat, runs_a[s], **opts_a) for s in common]
        b = [run_measure(stat, runs_b[s], **opts_b) for s in common]
        seeds_used.extend(common)
        effects = [_effect(x, y, kind) for x, y in zip(a, b, strict=True)]
        eff = st.one_sample_effect(effects, design="paired t over seeds")
        return eff, [runs_a[s] for s in common] + [runs_b[s] for s in common]
    if kind != "difference":
        raise ValueError(f"{spec['path']}: effect {kind!r} needs paired seeds; arms "
                         f"{test['a']!r} and {test['b']!r} cannot be paired")
    a = [run_measure(stat, r, **opts_a) for r in runs_a.values()]
    b = [run_measure(stat, r, **opts_b) for r in runs_b.values()]
    seeds_used.extend(sorted(set(runs_a) | set(runs_b)))
    eff = st.welch_effect(a, b)
    return (st.Effect(eff.estimate, eff.low, eff.high, eff.n, "Welch (unpaired) over seeds",
                      eff.se, eff.detectable), list(runs_a.values()) + list(runs_b.values()))


@functools.cache
def _git(*args: str, cwd: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _definition(text: str | None, cid: str) -> str | None:
    """Claim ``cid``'s test, the arms it names, ``key``, ``premise``, ``phase`` and
    ``sesoi``, as canonical JSON, from the text of a
    claims file (None where the file or the claim is absent or unreadable)."""
    import yaml

    try:
        data = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        return None
    entry = next((c for c in data["claims"] if isinstance(c, dict) and c.get("id") == cid),
                 None)
    if entry is None:
        return None
    test = _null_key(entry.get("test"))
    arms = data.get("arms") or {}
    named = {test.get(k) for k in ("a", "b")} if isinstance(test, dict) else set()
    return json.dumps({"test": test, "not_testable": entry.get("not_testable"),
                       "arms": {k: arms.get(k) for k in sorted(named, key=str) if k},
                       "key": bool(entry.get("key", False)), "premise": entry.get("premise"),
                       "phase": entry.get("phase") or "exploratory",
                       "sesoi": entry.get("sesoi")},
                      sort_keys=True, default=str)


def _definition_commit(path: Path, cid: str) -> str | None:
    """The commit from which claim ``cid`` has had its present test and arms: the last
    commit that changed them, so that a test edited after its runs is not dated by the
    commit that first named the claim. ``""`` when the present definition is not
    committed; None without git."""
    cwd = str(path.resolve().parent)
    history = _git("log", "--format=%H", "--reverse", "--", path.name, cwd=cwd)
    if history is None:
        return None
    current = _definition(path.read_text(encoding="utf-8"), cid)
    since = ""
    for commit in history.split():
        if _definition(_git("show", f"{commit}:./{path.name}", cwd=cwd), cid) == current:
            since = since or commit
        else:
            since = ""
    return since


def _declared(path: Path, cid: str, runs: list[StoredRun]) -> str:
    """Whether the commit that gave claim ``cid`` its present test and arms precedes the
    commits recorded in its runs' provenance."""
    claim_commit = _definition_commit(path, cid)
    if claim_commit is None:
        return "unknown"
    if not claim_commit:
        return "not yet committed"
    commits = {r.provenance.get("git_commit") for r in runs}
    if None in commits or not commits:
        return "unknown"
    cwd = str(path.resolve().parent)
    before = [_git("merge-base", "--is-ancestor", claim_commit, str(commit), cwd=cwd)
              is not None for commit in commits]
    if all(before):
        return "before its runs"
    return "after its runs" if not any(before) else "after some of its runs"


def _fmt(x: float, digits: int) -> str:
    return "nan" if math.isnan(x) else f"{x:+.{digits}f}"


def _short_of_plan(row: Mapping[str, Any]) -> bool:
    """Whether a confirmatory claim's row has fewer stored seeds (``n_seeds``) than its
    declaration plans (``planned_seeds``): as declared, it is *under way*, and no estimate
    or verdict is read before its last seed."""
    return row["phase"] == "confirmatory" and row["n_seeds"] < row["planned_seeds"]


def under_way_text(stored: int, planned: int) -> str:
    """A claim under way in words, for prose and lists: ``"under way, 4 of its 8 fresh
    seeds stored; nothing is read before the last"``."""
    for name, value in (("stored", stored), ("planned", planned)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a count of seeds, got {value!r}")
    return (f"under way, {stored} of its {planned} fresh seeds stored; nothing is read "
            f"before the last")


def _quantity(test: Mapping[str, Any] | None) -> str:
    """What a claim's test measures, so that a plot puts only like with like on one axis:
    the ``metric``, ``statistic`` or ``column`` option where the measure or study has one
    (``ood``, ``posthoc``, ``shift_ece``, a training history's ``val_loss``, ...), else the
    measure's name (``ece``, ``mce``, ``error``); ``""`` for a study without such an option
    or a claim without a test."""
    if not test:
        return ""
    for key in ("metric", "statistic", "column"):
        value = test.get("options", {}).get(key)
        if isinstance(value, str):
            return value
    return str(test.get("statistic") or "")


def _sentence(eff: st.Effect, unit: str, test: Mapping[str, Any]) -> str:
    digits = 3 if max(abs(eff.low), abs(eff.high), 1e-12) < 1 else 2
    unit = f" {unit}" if unit else ""
    units = {"paired t over seeds": "seeds", "Welch (unpaired) over seeds": "seeds",
             "one-sample t over seeds": "seeds", "bootstrap": "test samples",
             HIERARCHICAL: "seeds", "one-sample t": "replicates"}.get(eff.design, "replicates")
    design = eff.design
    if "margin" in test:
        design += f", non-inferiority with margin {test['margin']:+g}{unit}"
    text = (f"{design}, n = {eff.n} {units}: {_fmt(eff.estimate, digits)} "
            f"[{_fmt(eff.low, digits)}, {_fmt(eff.high, digits)}]{unit}")
    if eff.design in ("bootstrap", HIERARCHICAL):
        text += f" ({int(test['resamples'])} resamples)"
    if eff.design == "bootstrap":
        text += "; conditional on one trained network"
    if not math.isnan(eff.detectable):
        how = ("noncentral t, post hoc: from the observed SD" if math.isfinite(eff.df)
               else "normal approximation, post hoc: from the bootstrap SE")
        text += f"; detectable at 80% power: {eff.detectable:.{digits}f}{unit} ({how})"
    if test.get("paper") is not None:
        text += f"; reported: {test['paper']:+g}{unit}"
    return text + "."


class _ClaimError(ValueError):
    """An error raised while a claim was evaluated, naming its file and the claim."""


class _ClaimTypeError(_ClaimError, TypeError):
    """A ``TypeError`` raised while a claim was evaluated, naming its file and the claim."""


def _fewer_seeds(spec: Mapping[str, Any], test: Mapping[str, Any], index: _Index) -> str:
    """A sentence when an arm of ``test`` declares seeds that are not stored (empty else)."""
    notes = []
    for key in ("a", "b"):
        name = test.get(key)
        if name is None or not spec["arms"][name].get("seeds"):
            continue
        declared = spec["arms"][name]["seeds"]
        missing = sorted(set(declared) - set(index.arm(name, spec["arms"][name])))
        if missing:
            notes.append(f" Arm {name!r} declares {len(declared)} seeds; {len(missing)} not "
                         f"stored (seed(s) {', '.join(map(str, missing))}): answered by "
                         f"{len(declared) - len(missing)} of {len(declared)}.")
    return "".join(notes)


def evaluate_claims(spec: Mapping[str, Any] | str | Path,
                    store: RunStore | None = None) -> pd.DataFrame:
    """Evidence and verdict of every claim of a claims file (a path, or what
    :func:`load_claims` returned): one row per claim, columns ``TABLE_COLUMNS``;
    effects, intervals, ``paper`` and ``null`` in the claim's shown units."""
    if not isinstance(spec, Mapping):
        spec = load_claims(spec)
    if store is not None and not isinstance(store, RunStore):
        raise TypeError(f"store must be a RunStore, got {type(store).__name__}")
    labels = {lab for arm in spec["arms"].values()
              for lab in (arm["label"] if isinstance(arm["label"], list) else [arm["label"]])}
    index = _Index(store or RunStore(), labels)
    claims = {c["id"]: c for c in spec["claims"]}
    rows: dict[str, dict[str, Any]] = {}

    def evaluate(cid: str) -> dict[str, Any]:
        if cid in rows:
            return rows[cid]
        c = claims[cid]
        row = {k: c.get(k) or "" for k in ("id", "claim", "original", "work", "where",
                                           "premise", "question", "twin")}
        row.update(key=bool(c.get("key", False)), phase=c.get("phase", "exploratory"),
                   sesoi=float(c.get("sesoi") or math.nan),
                   planned_seeds=int(c.get("planned_seeds") or 0), p=math.nan,
                   p_adjusted=math.nan, adjusted="", premise_state="", n_seeds=0,
                   margin=float(c.get("test", {}).get("margin", math.nan)),
                   quantity=_quantity(c.get("test")), under_way=False)
        if "not_testable" in c:
            row.update(design="", n=0, estimate=math.nan, low=math.nan, high=math.nan,
                       detectable=math.nan, paper=math.nan, null=math.nan, direction="",
                       unit="", verdict=st.NOT_TESTABLE, verdict_raw=st.NOT_TESTABLE,
                       declared="", evidence=str(c["not_testable"]))
            rows[cid] = row
            return row
        t = c["test"]
        if "study" in t:
            if t["study"] not in STUDIES:
                raise ValueError(f"{spec['path']}: claim {cid!r}: unknown study "
                                 f"{t['study']!r}")
            values = np.asarray(STUDIES[t["study"]](**t["options"]), dtype=np.float64)
            eff = st.one_sample_effect(values.ravel())
            runs: list[StoredRun] = []
        else:
            seeds: list[int] = []
            try:
                eff, runs = _arm_effect(spec, t, index, seeds)
            except (_NoRuns, RunNotFound, _NotTrained) as missing:  # no run, a measure's
                # entry, or a run that did not train
                v = st.NOT_TRAINED if isinstance(missing, _NotTrained) else st.INCONCLUSIVE
                row.update(design="", n=0, estimate=math.nan, low=math.nan, high=math.nan,
                           detectable=math.nan,
                           paper=math.nan if t.get("paper") is None else float(t["paper"]),
                           null=float(t["null"]), direction=t["direction"], unit=t["unit"],
                           verdict=v, verdict_raw=v, under_way=_short_of_plan(row),
                           declared=("" if v == st.NOT_TRAINED
                                     else "declared; no runs yet"),
                           evidence=str(missing) + ".")
                rows[cid] = row
                return row
            row["n_seeds"] = len(set(seeds))
            if _short_of_plan(row):
                # a declared design is read at its planned seeds only: no peeking at a
                # replication half done, and no verdict that stopping early could choose
                row.update(design="", n=row["n_seeds"], estimate=math.nan, low=math.nan,
                           high=math.nan, detectable=math.nan,
                           paper=math.nan if t.get("paper") is None else float(t["paper"]),
                           null=float(t["null"]), direction=t["direction"], unit=t["unit"],
                           verdict=st.INCONCLUSIVE, verdict_raw=st.INCONCLUSIVE,
                           under_way=True, declared=_declared(Path(spec["path"]), cid, runs),
                           evidence=f"Under way: {row['n_seeds']} of the "
                                    f"{row['planned_seeds']} planned "
                                    f"seeds are stored; as declared, no estimate or verdict is "
                                    f"read before the last.")
                rows[cid] = row
                return row
        eff = eff.scaled(float(t["scale"]))
        paper = t.get("paper")
        v = st.verdict(eff.low, eff.high, t["direction"], float(t["null"]),
                       None if paper is None else float(paper))
        premise = c.get("premise")
        state = "" if premise is None else premise_state(named(premise)["verdict_raw"])
        note = premise_note(state)
        row.update(design=eff.design, n=eff.n, estimate=eff.estimate, low=eff.low,
                   high=eff.high, detectable=eff.detectable,
                   paper=math.nan if paper is None else float(paper), null=float(t["null"]),
                   direction=t["direction"], unit=t["unit"], verdict=v, verdict_raw=v,
                   premise_state=state, p=st.p_value(eff, float(t["null"])),
                   declared=(_declared(Path(spec["path"]), cid, runs) if runs
                             else "computed when the book is built"),
                   evidence=_sentence(eff, t["unit"], t) + _fewer_seeds(spec, t, index)
                   + (f" Premise {premise!r}: {state}." if note else ""))
        rows[cid] = row
        return row

    def named(cid: str) -> dict[str, Any]:
        """``evaluate``, its errors naming the file and the claim."""
        try:
            return evaluate(cid)
        except _ClaimError:
            raise
        except (ValueError, TypeError, LookupError, ArithmeticError, RuntimeError) as err:
            text = str(err)
            prefix = f"{spec['path']}: claim {cid!r}: "
            text = text if text.startswith(f"{spec['path']}: claim ") else prefix + text
            raise (_ClaimTypeError if isinstance(err, TypeError) else _ClaimError)(
                text) from err

    for cid in claims:
        named(cid)
    return pd.DataFrame([rows[c] for c in claims], columns=list(TABLE_COLUMNS))
