"""The Holm design with both nulls true, alone and with more simulations than `benchmarks.holm` runs: its
family-wise error (a true null called supported), each claim's rate, and how often a claim is contradicted
(which passes its share on).

    python -m benchmarks.holm_null [SIMS]   (default 2000; ~3 min on one core)
"""

import json
import sys
import time

import numpy as np

from benchmarks import claims_sim as cs
from benchmarks.holm import MAX, TEXTS
from studyrunner.analysis import sequential


def main() -> None:
    sims = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    data = cs.study(cs.template(3, MAX), 3)
    rng = np.random.default_rng([20261128, 0, 11])
    design = sequential.Design(2, MAX, 1)
    fw, per, passed, t0 = 0, [0, 0], 0, time.perf_counter()
    for _ in range(sims):
        y = cs.draw("normal", np.array([0.5, 0.5, 0.5]), MAX, rng)
        looks = cs.sequential_run(data, TEXTS, y, design, multiplicity="holm")
        states = [c.state for c in looks[-1].claims]
        sup = [s == "supported" for s in states]
        fw += any(sup)
        per[0] += sup[0]
        per[1] += sup[1]
        passed += any(s == "contradicted" for s in states)
    out = {
        "sims": sims,
        "fwer": fw / sims,
        "claim 1 supported": per[0] / sims,
        "claim 2 supported": per[1] / sims,
        "a claim contradicted": passed / sims,
        "seconds": round(time.perf_counter() - t0),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
