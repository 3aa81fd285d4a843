"""Train the confirmatory round's runs, claim by claim and seed by seed, and commit each
claim's runs of a seed as soon as they exist (a run survives only in git).

``python tools/confirm_runs.py [--chapters 06 02 ...] [--claims ID ...] [--reverse] [--no-commit]``

Two processes can share a chapter: give the second ``--claims`` and ``--reverse`` (seeds from
the highest down), and the two meet in the middle; a run one of them trains is locked, and
the other waits for it (up to an hour) and then reads it instead of training it again.

Resumable: the executor skips runs already stored, a killed run resumes from its last
checkpoint. After a seed's runs are trained, the claim's measure is read once on them, so
that what it needs besides the logits (OOD or shifted-image logits, computed from the
run's final checkpoint) is stored inside the run's folder before the commit. One thread,
one run at a time. The commits carry runs only: before the last one, refresh the claims
cache of the chapters they changed (``make claims-cache``), or the book evaluates them
while it builds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from calnotes.book import evidence  # noqa: E402,F401  (registers measures and studies)
from calnotes.runs import claims as cl  # noqa: E402
from calnotes.runs import confirm  # noqa: E402
from calnotes.runs.executor import execute  # noqa: E402
from calnotes.runs.store import RunStore  # noqa: E402

#: The order of the runs: cheapest seeds first, so that most claims finish early.
ORDER = ["06", "02", "04", "03", "05"]


def _uncommitted(paths: list[str]) -> bool:
    """Whether git sees anything under ``paths`` that is not committed."""
    status = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return bool(status.stdout.strip())


def _commit(folders: list[Path], message: str) -> None:
    paths = [str(f.relative_to(REPO)) for f in folders]
    if not _uncommitted(paths):  # runs shared with a claim committed before: nothing new
        return
    for attempt in range(20):
        add = subprocess.run(["git", "add", "--", *paths], cwd=REPO, capture_output=True,
                             text=True)
        if add.returncode == 0:
            done = subprocess.run(["git", "commit", "-q", "-m", message, "--", *paths],
                                  cwd=REPO, capture_output=True, text=True)
            if done.returncode == 0:
                return
            err = done.stderr
        else:
            err = add.stderr
        if not _uncommitted(paths):  # the other process committed the same runs first
            return
        if "index.lock" not in err:
            raise RuntimeError(f"git failed: {err}")
        time.sleep(3 + attempt)
    raise RuntimeError("git index stayed locked")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chapters", nargs="*", default=ORDER)
    ap.add_argument("--claims", nargs="*", default=None,
                    help="only these confirmatory claims (ids), in the file's order")
    ap.add_argument("--reverse", action="store_true", help="seeds from the highest down")
    ap.add_argument("--no-commit", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    store = RunStore()
    plan = []  # (chapter, its claims file, the confirmatory claims to run), checked first
    for ch in args.chapters:
        spec = cl.load_claims(REPO / "book" / "claims" / f"{ch}.yaml")
        plan.append((ch, spec, [c for c in spec["claims"] if c.get("phase") == "confirmatory"
                                and "a" in c.get("test", {})
                                and (args.claims is None or c["id"] in args.claims)]))
    unknown = sorted(set(args.claims or ()) - {c["id"] for _, _, cs in plan for c in cs})
    if unknown:
        raise SystemExit(f"--claims: no confirmatory claim {unknown} in chapters "
                         f"{args.chapters}")
    for ch, spec, confirmatory in plan:
        for c in confirmatory:  # claim by claim (the file's order), seed by seed
            arms = [c["test"][k] for k in ("a", "b") if k in c["test"]]
            seeds = set.intersection(*(set(spec["arms"][a]["seeds"]) for a in arms))
            for seed in sorted(seeds, reverse=args.reverse):
                folders: set[Path] = set()
                # the twin's arms hold the template runs
                for label, config in confirm.confirmatory_configs(spec, c["twin"], [seed],
                                                                  store):
                    execute([config], label=label, store=store, backend="sequential",
                            device="cpu", lock_timeout=3600.0)
                    folders.add(store.load(config).path)
                confirm.claim_seed_values(spec, c["id"], store, [seed])  # stores what it reads
                print(f"{ch} {c['id']} seed {seed}: done", flush=True)
                if not args.no_commit:
                    _commit(sorted(folders), f"Confirmatory runs of chapter {ch}, seed {seed}, "
                                             f"for {c['id']} ({len(folders)} runs, with the "
                                             f"entries the claim reads)")


if __name__ == "__main__":
    main()
