"""Compute chapter 3's binary ResNet-18 runs ("9 vs not-9") by the rule its claims file declares.

The rule (``book/claims/03.yaml``): the number of epochs E is the one of {2, 4} with the lower
validation error of seed 0 (a tie goes to fewer epochs); seeds 1 and 2 are trained for 4
epochs alongside seed 0's candidates, and for 2 epochs too if the rule picks 2. The test set
plays no part. Every run goes through the executor (Ray on this machine's cores when it is
installed), is stored in ``results/`` and resumes from its checkpoint when killed::

    PYTHONPATH=$PWD nohup .venv/bin/python tools/ch03_runs.py > ch03_runs.log 2>&1 &
"""

from __future__ import annotations

import sys
import time

from calnotes.book.evidence.ch03 import RULE_EPOCHS, RULE_SEEDS, binary_r18_config, rule_epochs
from calnotes.runs.executor import execute
from calnotes.runs.store import RunStore

LABEL = "ch03_posthoc"


def main() -> int:
    start = time.perf_counter()
    store = RunStore()
    first = [binary_r18_config(0, e) for e in RULE_EPOCHS]
    first += [binary_r18_config(s, max(RULE_EPOCHS)) for s in RULE_SEEDS[1:]]
    execute(first, label=LABEL, store=store, device="cpu", threads=1)
    chosen = rule_epochs({e: store.load(binary_r18_config(0, e)) for e in RULE_EPOCHS})
    print(f"the rule picks {chosen} epochs", flush=True)
    execute([binary_r18_config(s, chosen) for s in RULE_SEEDS], label=LABEL, store=store,
            device="cpu", threads=1)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
