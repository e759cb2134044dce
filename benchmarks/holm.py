"""Multiplicity over a sequential study's claims by simulation: the graphical group-sequential Holm design
(`multiplicity: holm`; Maurer & Bretz 2013) against each claim at its own alpha, post-hoc Holm on the repeated
p-values (`verify --holm`), and a fixed 8-seed study with Holm's step-down, through the product's own code.

    python -m benchmarks.holm [--sims 300] [--out PATH]

Three cells sharing their seeds (arm 0 a control), the claims `eval_accuracy[arm=1] > eval_accuracy[arm=0]` and
`eval_accuracy[arm=2] > eval_accuracy[arm=0]`, normal seeds (benchmarks/claims_sim.py), sequential seeds 2 -> 8
(step 1, O'Brien-Fleming). Scenarios: both nulls true; claim 1 true (an effect δ a fixed paired t at 8 seeds
detects with 80% power at one-sided 0.05) and claim 2 null; both true. Per method: the family-wise error (the
share of studies in which a true null is called supported), the power of each true claim (supported), and the
seeds per cell.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

from benchmarks import claims_sim as cs
from studyrunner.analysis import claims, sequential

TEXTS = ["eval_accuracy[arm=1] > eval_accuracy[arm=0]", "eval_accuracy[arm=2] > eval_accuracy[arm=0]"]
MAX = 8


def effect() -> float:
    """δ a fixed paired t at MAX seeds detects with 80% power at one-sided 0.05 (normal seeds)."""
    sd = math.sqrt(2) * cs.NOISE_SD
    return float((stats.t.isf(0.05, MAX - 1) + stats.norm.ppf(0.8)) * sd / math.sqrt(MAX))


SCENARIOS = {"both null": (False, False), "one true, one null": (True, False), "both true": (True, True)}


def simulate(scenario: str, sims: int, seed: int = 0) -> dict[str, dict[str, float]]:
    true = SCENARIOS[scenario]
    delta = effect()
    means = np.array([0.5, 0.5 + delta * true[0], 0.5 + delta * true[1]])
    data = cs.study(cs.template(3, MAX), 3)
    rng = np.random.default_rng([seed, list(SCENARIOS).index(scenario), 11])
    design = sequential.Design(2, MAX, 1)
    methods = ("each at alpha", "post-hoc Holm (verify --holm)", "Holm design (multiplicity: holm)", "fixed 8, Holm")
    tally = {m: {"fwer": 0, "power 1": 0, "power 2": 0, "seeds": 0.0} for m in methods}
    for _ in range(sims):
        y = cs.draw("normal", means, MAX, rng)
        found = {}
        plain = cs.sequential_run(data, TEXTS, y, design)
        found["each at alpha"] = ([c.state for c in plain[-1].claims], plain[-1].seeds)
        ps = [c.p_sequential for c in plain[-1].claims]
        kind = claims.VerdictKind
        verdicts = [claims.Verdict(t, kind.SUPPORTED if s == kind.SUPPORTED else kind.INCONCLUSIVE, p=p)
                    for t, s, p in zip(TEXTS, found["each at alpha"][0], ps, strict=True)]  # fmt: skip
        for v in verdicts:
            if not np.isfinite(v.p):
                v.verdict = claims.VerdictKind.PENDING  # a claim without a p: Holm leaves it out
        adjusted = claims.adjust_holm(verdicts)
        found["post-hoc Holm (verify --holm)"] = ([v.verdict_holm for v in adjusted], plain[-1].seeds)
        holm = cs.sequential_run(data, TEXTS, y, design, multiplicity="holm")
        found["Holm design (multiplicity: holm)"] = ([c.state for c in holm[-1].claims], holm[-1].seeds)
        at_max = cs.with_values(data, y)
        fixed = claims.verify(at_max, TEXTS, holm=True)
        found["fixed 8, Holm"] = ([v.verdict_holm for v in fixed], {c: MAX for c in data.cells_order})
        for m, (states, seeds) in found.items():
            supported = [s == "supported" for s in states]
            tally[m]["fwer"] += any(ok and not t for ok, t in zip(supported, true, strict=True))
            tally[m]["power 1"] += supported[0]
            tally[m]["power 2"] += supported[1]
            tally[m]["seeds"] += float(np.mean(list(seeds.values())))
    return {m: {k: v / sims for k, v in t.items()} for m, t in tally.items()}


def table(sims: int, seed: int = 0, echo=print) -> list[dict]:
    rows = []
    for scenario, true in SCENARIOS.items():
        started = time.perf_counter()
        found = simulate(scenario, sims, seed)
        for method, r in found.items():
            row = {
                "scenario": scenario,
                "method": method,
                "family-wise error": r["fwer"] if not all(true) else math.nan,
                "power, claim 1": r["power 1"] if true[0] else math.nan,
                "power, claim 2": r["power 2"] if true[1] else math.nan,
                "seeds/cell": r["seeds"],
                "seconds": round(time.perf_counter() - started, 1),
            }
            rows.append(row)
            echo(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.holm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return cs.report(args.sims, args.out, lambda: table(args.sims, args.seed), per="scenario")


if __name__ == "__main__":
    sys.exit(main())
