"""The `unconverged` threat by simulation: how often it is raised on curves that have converged and on curves
that have not, and how often it is right that more training would change the verdict.

    python -m benchmarks.validity [--sims 300] [--seed 0] [--out PATH]

Synthetic studies, no training: two cells (arm 0 and arm 1), `seeds` seeds each, 1,000 steps, an eval every
100 steps on 512 examples (eval noise: a binomial share). A cell's accuracy follows
y(t) = c + (top − c)·(1 − exp(−t/τ)) with chance c = 0.25; a seed's τ and top vary a little (±10%, ±0.01).
The claim is `y[arm=1] > y[arm=0]`, decided by `analysis.claims.evaluate` on the final values, and the threat by
`analysis.claims.validity.assess` on the stored curves: what `verify` does.

Scenarios (τ as a share of training):
- both converged, no difference: τ = 0.1 for both, top 0.85;
- both converged, a real difference: τ = 0.1, top 0.90 vs 0.85;
- arm 0 slower, same top: arm 1 τ = 0.1, arm 0 τ = 0.6 (at 1,000 steps still ~0.07 short of 0.85, rising);
- both slow, same top: τ = 0.6 for both;
- arm 1 slower but ahead in top: arm 1 τ = 0.6, top 0.95; arm 0 τ = 0.1, top 0.85.

For each: the share of studies whose claim carries `unconverged`, the share supported, and "changes": the share
whose verdict at 4,000 steps (the same curves carried on) differs from the verdict at 1,000, so the flag can be
read against what more training would really do.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from studyrunner.analysis import claims as analysis_claims
from studyrunner.analysis.claims import validity
from studyrunner.analysis.data import from_frame

CHANCE = 0.25
EXAMPLES = 512
EVERY = 100
CLAIM = "eval_accuracy[arm=1] > eval_accuracy[arm=0]"
# p-hop over 4 symbols (chance 0.25), for the levels the threats read
TASK = {"task.name": "phop", "task.params.alphabet": 4, "task.params.seq_len": 12, "task.params.hops": 1,
        "eval.examples": EXAMPLES}  # fmt: skip
SCENARIOS = {
    "converged, no difference": ((0.1, 0.85), (0.1, 0.85)),
    "converged, difference 0.05": ((0.1, 0.85), (0.1, 0.90)),
    "arm 0 slower, same top": ((0.6, 0.85), (0.1, 0.85)),
    "both slower, same top": ((0.6, 0.85), (0.6, 0.85)),
    "arm 1 slower, higher top": ((0.1, 0.85), (0.6, 0.95)),
}


def curve(rng: np.random.Generator, tau: float, top: float, steps: int) -> list[tuple[int, float]]:
    tau = tau * (1 + rng.uniform(-0.1, 0.1)) * 1000
    top = top + rng.uniform(-0.01, 0.01)
    out = []
    for t in range(EVERY, steps + 1, EVERY):
        mean = CHANCE + (top - CHANCE) * (1 - math.exp(-t / tau))
        out.append((t, rng.binomial(EXAMPLES, min(max(mean, 0.0), 1.0)) / EXAMPLES))
    return out


def one_study(rng: np.random.Generator, arms, seeds: int, steps: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, points = [], []
    for arm, (tau, top) in enumerate(arms):
        for seed in range(seeds):
            key = f"a{arm}s{seed}"
            c = curve(np.random.default_rng([rng.integers(1 << 31), arm, seed]), tau, top, steps)
            rows.append({"trial_key": key, "cell_hash": f"c{arm}", "cell": f"arm={arm}", "seed": seed,
                         "status": "succeeded", "model.params.arm": arm, "train.steps": steps, **TASK,
                         "eval_accuracy": c[-1][1]})  # fmt: skip
            points += [{"trial_key": key, "step": t, "eval_accuracy": v} for t, v in c]
    return pd.DataFrame(rows), pd.DataFrame(points)


def verdict_of(trials: pd.DataFrame, curves: pd.DataFrame):
    data = from_frame(trials, claims=[CLAIM])
    data.__dict__["curves"] = curves  # the cached curves, as the curve store would give them
    verdict = analysis_claims.evaluate(data, CLAIM)
    return data, verdict


def run(sims: int, seed: int, seeds_per_cell: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, arms in SCENARIOS.items():
        rng = np.random.default_rng([seed, seeds_per_cell, len(name)])
        flagged = supported = changes = right = 0
        for _ in range(sims):
            state = rng.integers(1 << 31)
            trials, curves = one_study(np.random.default_rng(state), arms, seeds_per_cell, 1000)
            data, verdict = verdict_of(trials, curves)
            threats = validity.assess(data, CLAIM, verdict)
            flag = any(t.threat == validity.ThreatKind.UNCONVERGED for t in threats)
            longer_trials, longer_curves = one_study(np.random.default_rng(state), arms, seeds_per_cell, 4000)
            _, later = verdict_of(longer_trials, longer_curves)
            changed = later.verdict != verdict.verdict
            flagged += flag
            supported += verdict.verdict == "supported"
            changes += changed
            right += flag == changed
        out[name] = {
            "flagged": flagged / sims,
            "supported": supported / sims,
            "verdict changes by 4x steps": changes / sims,
            "flag agrees with change": right / sims,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    table = {f"{n} seeds": run(args.sims, args.seed, n) for n in (3, 5)}
    result = {"sims": args.sims, "seed": args.seed, "seconds": round(time.perf_counter() - started, 1), "table": table}
    for seeds, rows in table.items():
        print(f"\n{seeds}")
        print(f"{'scenario':32s} {'flagged':>8s} {'supported':>10s} {'changes':>8s} {'agrees':>7s}")
        for name, r in rows.items():
            print(f"{name:32s} {r['flagged']:8.3f} {r['supported']:10.3f} {r['verdict changes by 4x steps']:8.3f} "
                  f"{r['flag agrees with change']:7.3f}")  # fmt: skip
    out = args.out or Path(__file__).parent / "results" / f"{time.strftime('%Y-%m-%d')}-validity-unconverged.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['seconds']} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
