"""Equivalence (`A ~= B`, margin δ) and non-inferiority (`A >= B`, margin δ) claims by simulation: the rate of false
equivalence at the margin's edge, and power at no difference, for the fixed design at 2-8 seeds and the sequential
design 2 -> 8 (step 1, O'Brien-Fleming), through the product's own code (`claims.evaluate`; `take_look` via
`sequential.run_sequential`).

    python -m benchmarks.equivalence [--sims 300] [--shapes normal,ceiling] [--out PATH]

Two cells, the claim `eval_accuracy[arm=1] ~= eval_accuracy[arm=0]` (and `>=` for non-inferiority), every seed
shared by both cells (the paired test). Data shapes (benchmarks/claims_sim.py): `normal` (arm 0 at 0.5, δ = 0.08),
`ceiling` (arm 0 at a clipped mean of 0.95 on 512 examples, seeds tying at 1.0; δ = 0.04), `bimodal` (seeds that
fail to chance or learn, arm 0 failing 30% of the time, mean 0.74; δ = 0.1, the difference of means reached by a
difference of failure rates) and `bimodal-rule` (the same seeds under a `failure:` rule). δ is chosen so the
fixed design at 8 seeds has roughly 60-80% power at no difference on the normal and ceiling shapes.

Rows: the true difference arm 1 − arm 0 at +δ and −δ (the edge of the margin: "supported" is a false equivalence,
at most 0.05 by design) and at 0 (the share supported is the power); for non-inferiority −δ (false) and 0 (power).
"sequential: seeds" is the mean seeds per cell at the end (under the truth of its row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import claims_sim as cs
from studyrunner.analysis import sequential
from studyrunner.study.claim_entries import ClaimEntry

MARGIN = {"normal": 0.08, "ceiling": 0.04, "bimodal": 0.1, "bimodal-rule": 0.1}
BASE = {"normal": 0.5, "ceiling": 0.95, "bimodal": 0.74, "bimodal-rule": 0.74}
FIXED = (2, 3, 4, 5, 6, 8)
EQUIVALENT = "eval_accuracy[arm=1] ~= eval_accuracy[arm=0]"
NOT_WORSE = "eval_accuracy[arm=1] >= eval_accuracy[arm=0]"


def simulate(shape: str, claim: str, truth: float, sims: int, seed: int = 0) -> dict:
    """Per design (fixed n, sequential 2 -> 8): the share of studies whose claim is supported, contradicted, and
    (sequential) stopped for futility, and mean seeds; `truth`: arm 1 − arm 0 as a multiple of δ."""
    delta = MARGIN[shape]
    entry = ClaimEntry(claim=claim, margin=delta)
    data = cs.study(cs.template(2, 8), 2, cs.RULE if shape == "bimodal-rule" else None)
    rng = np.random.default_rng([seed, cs.SHAPES.index(shape), int(round(truth * 10)) + 50, len(claim)])
    means = np.array([BASE[shape], BASE[shape] + truth * delta])
    design = sequential.Design(2, 8, 1)
    counts = {f"fixed {n}": {"supported": 0, "contradicted": 0} for n in FIXED}
    seq = {"supported": 0, "contradicted": 0, "futile": 0, "seeds": 0.0}
    for _ in range(sims):
        y = cs.draw(shape, means, 8, rng)
        for n in FIXED:
            verdict = cs.fixed_verdict(data, entry, y, n)
            if verdict in ("supported", "contradicted"):
                counts[f"fixed {n}"][verdict] += 1
        history = cs.sequential_run(data, entry, y, design)
        (c,) = sequential.final_states(history)
        if c.state in ("supported", "contradicted", "futile"):
            seq[c.state] += 1
        seq["seeds"] += float(np.mean(list(history[-1].seeds.values())))
    out = {k: {kk: vv / sims for kk, vv in v.items()} for k, v in counts.items()}
    out["sequential 2->8"] = {k: (v / sims) for k, v in seq.items()}
    return out


def table(sims: int, shapes, seed: int = 0, echo=print) -> list[dict]:
    rows = []
    for shape in shapes:
        cases = ((EQUIVALENT, "equivalence", (1.0, -1.0, 0.0)), (NOT_WORSE, "non-inferiority", (-1.0, 0.0)))
        for claim, kind, truths in cases:
            for truth in truths:
                started = time.perf_counter()
                found = simulate(shape, claim, truth, sims, seed)
                row = {"claim": kind, "data": shape, "margin": MARGIN[shape], "true difference": f"{truth:+g}δ"}
                for design, r in found.items():
                    row[design] = r["supported"]
                row["sequential: seeds"] = found["sequential 2->8"]["seeds"]
                row["sequential: futile"] = found["sequential 2->8"]["futile"]
                row["seconds"] = round(time.perf_counter() - started, 1)
                rows.append(row)
                echo(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.equivalence", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sims", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shapes", default=",".join(cs.SHAPES))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return cs.report(
        args.sims, args.out, lambda: table(args.sims, [s for s in args.shapes.split(",") if s], args.seed), per="row"
    )


if __name__ == "__main__":
    sys.exit(main())
