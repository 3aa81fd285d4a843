"""Declare the book's confirmatory round: its claims, their smallest effects of interest,
the fresh seeds a power calculation asks for, and the plan beside them.

``python tools/confirm_declare.py plan``     compute the plan (the exploratory twins'
                                             spread from the stored runs) into
                                             book/claims/confirmatory_plan.csv
``python tools/confirm_declare.py declare``  append the confirmatory arms and claims to the
                                             claims files, from that plan

Each confirmatory claim copies its exploratory twin (claim, work, quote, test) onto arms of
fresh seeds (1000 onward, never used by any stored run). Its ``sesoi`` is half the paper's
reported effect where one is reported, otherwise the value argued in ``SESOI`` below. Seeds:
the exact noncentral-t number that detects the SESOI with 80% power at alpha = 0.05 / m
(Holm's first step over the round's m claims, the level each is sure to be tested at),
at least 4 and at most the cap of its chapter (the cost of its runs against the round's
budget of about 8 hours of 2 cores). An arm gets the largest number of seeds any of its
claims asks for; a claim is paired on its arms' common seeds, so it may get more seeds
than its own power asks for, never fewer than planned.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calnotes import stats  # noqa: E402
from calnotes.book import evidence  # noqa: E402,F401  (registers measures and studies)
from calnotes.runs import claims as cl  # noqa: E402
from calnotes.runs import confirm  # noqa: E402

PLAN = REPO / "book" / "claims" / "confirmatory_plan.csv"
FIRST_SEED = 1000
POWER = 0.8
FAMILY_ALPHA = 0.05
BUDGET_SECONDS = 8 * 3600 * 2  # 8 hours of 2 cores

#: (chapter, twin, sesoi, why, cap): in the order of the works' message. Units are the
#: claim's shown units.
SESOI: list[tuple[str, str, float, str, int]] = [
    ("01", "sece-less-biased", 0.1, "a tenth of an ECE point of bias: below it the choice "
     "between the estimators does not matter at the book's test-set size", 200),
    ("01", "sece-less-biased-network", 0.1, "as above", 200),
    ("02", "fig1-same-way-ece", 6.755, "half of Figure 1's ECE gap between ResNet-110 "
     "(16.53%) and LeNet-5 (3.02%)", 12),
    ("02", "wd-ece-resnet", 1.0, "one ECE point; Figure 2 reports a curve, not a number", 12),
    ("02", "nll-rises", 0.05, "0.05 nats, about a tenth of the test NLL of the runs", 10),
    ("02", "nll-error-falls", 1.0, "half of the 2 points of error reported", 10),
    ("03", "r18-binary-overconfident", 0.25, "a quarter of an ECE point: the lecture gives a "
     "diagram, not a number", 10),
    ("04", "ce-overconfident-l5", 1.0, "one point of confidence above accuracy", 12),
    ("04", "ln-msp-fpr95-l5", 10.0, "the reported 42.3 points are a maximum over "
     "benchmarks ('up to'); a quarter of it, 10 points, would change a practitioner's "
     "choice of detector", 12),
    ("04", "ce-norm-grows-reg", 0.25, "a quarter of a percent of logit-norm growth per "
     "epoch", 12),
    ("04", "ce-overconfident-reg", 1.0, "one point of confidence above accuracy", 12),
    ("04", "ln-msp-fpr95-reg", 10.0, "as for ln-msp-fpr95-l5", 12),
    ("04", "ce-overconfident-r8", 1.0, "one point of confidence above accuracy", 8),
    ("04", "ln-msp-fpr95-r8", 10.0, "as for ln-msp-fpr95-l5", 8),
    ("05", "ce-overconfident", 1.0, "one point of confidence above accuracy", 8),
    ("05", "flsece-vs-ce-ece", 0.959, "half of Table 1's 1.918 ECE points", 10),
    ("05", "learned-gamma-vs-fixed", 0.5275, "half of Table 1's 1.055 ECE points", 8),
    ("05", "sece-vs-dece-mce", 16.954, "half of Table 1's 33.908 MCE points", 8),
    ("05", "flsece-vs-cedece-mce", 9.3105, "half of Table 1's 18.621 MCE points", 8),
    ("06", "degrade-ce", 5.0, "five ECE points of growth, a tenth of Figure 1's range", 20),
    ("06", "ts-iid", 0.25, "a quarter of an ECE point, the size of the paper's i.i.d. gain "
     "at MNIST's low ECE", 20),
    ("06", "ts-vs-ensemble-shift", 5.0, "five ECE points at 60 degrees", 20),
    ("06", "ensemble-vs-ce", 5.0, "five ECE points at 60 degrees", 20),
]


def _files() -> dict[str, dict[str, Any]]:
    return {ch: cl.load_claims(REPO / "book" / "claims" / f"{ch}.yaml")
            for ch in sorted({c for c, *_ in SESOI})}


def _claim(spec: dict[str, Any], cid: str) -> dict[str, Any]:
    return next(c for c in spec["claims"] if c["id"] == cid)


def plan() -> None:
    specs = _files()
    alpha = FAMILY_ALPHA / len(SESOI)
    rows: dict[str, dict[str, Any]] = {}
    arms_of: dict[str, list[str]] = {}
    for ch, cid, sesoi, why, cap in SESOI:
        spec = specs[ch]
        t = _claim(spec, cid)["test"]
        if "study" in t:
            values = confirm.study_values(spec, cid)
        else:
            values = list(confirm.claim_seed_values(spec, cid).values())
            arms_of[cid] = [f"{ch}/{t[k]}" for k in ("a", "b") if k in t]
        p = confirm.plan_claim(values, sesoi, alpha, cap, POWER)
        rows[cid] = {"chapter": ch, "claim": f"c-{cid}", "twin": cid,
                     "arms": " ".join(a.split("/")[1] for a in arms_of.get(cid, [])),
                     **{k: v for k, v in p.as_row().items() if k != "claim"}, "why": why}
    planned, arm_seeds = confirm.shared_seeds({c: r["planned"] for c, r in rows.items()},
                                              arms_of)
    for cid, r in rows.items():
        r["planned"] = planned[cid]
        r["power_planned"] = stats.power_t(r["sesoi"], r["sd"], planned[cid], alpha)
        print(f"{r['chapter']} {cid:28s} sd {r['sd']:8.3f} need {r['needed']:3d} "
              f"plan {r['planned']:3d} power {r['power_planned']:.2f}", flush=True)
    total = sum(n * confirm.arm_seed_cost(specs[arm.split("/")[0]], arm.split("/")[1])
                for arm, n in arm_seeds.items())
    with PLAN.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[*next(iter(rows.values())), "round_seconds"])
        w.writeheader()
        for r in rows.values():
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()}
                       | {"round_seconds": round(total)})
    print(f"alpha per claim {alpha:.5f}; training estimate {total / 3600:.1f} core-hours "
          f"(budget {BUDGET_SECONDS / 3600:.0f}; chapter 6's ensemble members and OOD or "
          f"shifted logits not included)")


def _read_plan() -> list[dict[str, str]]:
    with PLAN.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


class _NoAliases(yaml.SafeDumper):
    """Writes repeated lists out (a file's own anchors must not collide with ours)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


#: Test fields at their loader defaults, left out of the written claims.
_DEFAULTS = {"design": "auto", "resamples": 2000, "null": 0.0, "scale": 1.0,
             "effect": "difference", "options": {}, "unit": ""}


def _dump(obj: Any, indent: int) -> str:
    text = yaml.dump(obj, Dumper=_NoAliases, sort_keys=False, allow_unicode=True, width=96)
    return "".join(" " * indent + line + "\n" for line in text.splitlines())


def declare() -> None:
    rows = _read_plan()
    specs = _files()
    for ch in sorted({r["chapter"] for r in rows}):
        path = REPO / "book" / "claims" / f"{ch}.yaml"
        text = path.read_text(encoding="utf-8")
        spec = specs[ch]
        arms: dict[str, Any] = {}
        claims: list[dict[str, Any]] = []
        mine = [r for r in rows if r["chapter"] == ch]
        twins = {r["twin"] for r in mine}
        arm_seeds: dict[str, int] = {}
        for r in mine:  # an arm holds the largest number of seeds its claims plan
            for arm in r["arms"].split():
                arm_seeds[arm] = max(arm_seeds.get(arm, 0), int(r["planned"]))
        for r in mine:
            twin = _claim(spec, r["twin"])
            test = {k: v for k, v in twin["test"].items() if _DEFAULTS.get(k, ...) != v}
            for key in ("a", "b"):
                if key in test:
                    arm = dict(spec["arms"][test[key]])
                    n = arm_seeds[test[key]]
                    arm["seeds"] = list(range(FIRST_SEED, FIRST_SEED + n))
                    arms[f"c-{test[key]}"] = arm
                    test[key] = f"c-{test[key]}"
            if "study" in test:
                test["options"] = {**test["options"], "seed": FIRST_SEED,
                                   "draws": int(r["planned"])}
            claim = {"id": r["claim"], "phase": "confirmatory", "twin": r["twin"],
                     "key": bool(twin.get("key", False)), "sesoi": float(r["sesoi"]),
                     "planned_seeds": int(r["planned"])}
            if twin.get("premise") in twins:
                claim["premise"] = f"c-{twin['premise']}"
            for k in ("question", "claim", "original", "work", "where"):
                if twin.get(k):
                    claim[k] = twin[k]
            claim["test"] = test
            claims.append(claim)
        # the arms go first in the arms mapping, the claims last in the claims list
        lines = text.splitlines(keepends=True)
        at = next(i for i, line in enumerate(lines) if line.rstrip() == "arms:"
                  or line.startswith("arms: {}"))
        if arms:
            if lines[at].startswith("arms: {}"):
                lines[at] = "arms:\n"
            lines.insert(at + 1, "  # The confirmatory round's arms: the exploratory arms at "
                                 "fresh seeds.\n" + _dump(arms, 2))
        items = [ln for ln in lines if ln.lstrip().startswith("- id:")]
        indent = len(items[0]) - len(items[0].lstrip()) if items else 2
        body = "".join(lines).rstrip("\n") + "\n"
        body += " " * indent + ("# The confirmatory round (declared before any of its runs; "
                                "plan: confirmatory_plan.csv).\n")
        body += _dump(claims, indent)
        path.write_text(body, encoding="utf-8")
        cl.load_claims(path)  # the file still loads
        print(f"{path.name}: {len(arms)} arms, {len(claims)} confirmatory claims")


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("plan", "declare"):
        sys.exit(__doc__)
    {"plan": plan, "declare": declare}[sys.argv[1]]()
