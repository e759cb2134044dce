"""A mean against a number on skewed seeds, by simulation: the one-sample t-test alone (how a metric of no known range
was decided before), today's rule (no test of a mean against a number without a known range: inconclusive, and a
sequential look stops it at once; a range unbounded at one end, as a task declares for a loss, counts as none), and
the median's exact sign test, through the product's own code.

    python -m benchmarks.skewed [--sims 400] [--out PATH]

One cell, the metric `score` (no task declares its range), seeds exponential(1) (mean 1), lognormal(0, 1)
(mean e^0.5) or normal (mean 1, sd 0.3). Claims `score[arm=0] < c` and `score[arm=0] > c` with c the true mean
(every "supported" is a false positive); `median(score)[arm=0] < m`, `> m` with m the true median; and, for power,
`score[arm=0] > c / 2`. Fixed design at 8 seeds and sequential 2 -> 8 (step 1, O'Brien-Fleming).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import claims_sim as cs
from studyrunner.analysis import sequential
from studyrunner.analysis.claims import bounded, location

METRIC = "score"
SHAPES = {
    "exponential": (lambda rng, n: rng.exponential(1.0, n), 1.0, math.log(2)),
    "lognormal": (lambda rng, n: rng.lognormal(0.0, 1.0, n), math.exp(0.5), 1.0),
    "normal": (lambda rng, n: 1.0 + rng.normal(0, 0.3, n), 1.0, 1.0),
}


class _Before:
    """The t-test alone on a metric of no known range, as before (no refusal, no gate)."""

    def __enter__(self):
        self.was = bounded.range_of, location._gate
        bounded.range_of = lambda data, metric: (-math.inf, math.inf)
        location._gate = lambda *a, **k: (0.0, 0.0)

    def __exit__(self, *exc):
        bounded.range_of, location._gate = self.was


def simulate(shape: str, rule: str, claim: str, sims: int, seed: int = 0) -> dict:
    gen, mean, median = SHAPES[shape]
    value = {"mean": mean, "median": median, "half": mean / 2}
    kind, op, at = claim.split()
    text = f"{'median(score)' if kind == 'median' else 'score'}[arm=0] {op} {value[at]:.10g}"
    data = cs.study(cs.template(1, 8, METRIC), 1, metric=METRIC)
    rng = np.random.default_rng([seed, list(SHAPES).index(shape), len(claim)])
    context = {"before: t-test alone": _Before}.get(rule)
    out = {"fixed 8": 0, "sequential 2->8": 0, "seeds": 0.0}
    manager = context() if context else None
    if manager:
        manager.__enter__()
    try:
        for _ in range(sims):
            y = gen(rng, 8)
            out["fixed 8"] += cs.fixed_verdict(data, text, y, 8) == "supported"
            history = cs.sequential_run(data, text, y, sequential.Design(2, 8, 1))
            (c,) = sequential.final_states(history)
            out["sequential 2->8"] += c.state == "supported"
            out["seeds"] += history[-1].seeds["c0"]
    finally:
        if manager:
            manager.__exit__(None, None, None)
    return {k: v / sims for k, v in out.items()}


CASES = [
    ("mean < mean", ("before: t-test alone", "now: no known range")),
    ("mean > mean", ("before: t-test alone", "now: no known range")),
    ("mean > half", ("before: t-test alone", "now: no known range")),
    ("median < median", ("now: no known range",)),
    ("median > median", ("now: no known range",)),
]


def table(sims: int, seed: int = 0, echo=print) -> list[dict]:
    rows = []
    for shape in SHAPES:
        for claim, rules in CASES:
            for rule in rules:
                started = time.perf_counter()
                r = simulate(shape, rule, claim, sims, seed)
                kind, op, at = claim.split()
                what = {"mean": "the true mean", "median": "the true median", "half": "half the true mean (power)"}[at]
                row = {"data": shape, "claim": f"{kind} {op} {what}", "rule": rule, **r,
                       "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
                rows.append(row)
                echo(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.skewed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return cs.report(args.sims, args.out, lambda: table(args.sims, args.seed), per="row")


if __name__ == "__main__":
    sys.exit(main())
