"""The verdicts of a GPU study's first look from `benchmarks/gpu_study.py`'s JSON lines (no ledger needed).

    .venv/bin/python benchmarks/gpu_study_verdicts.py studies/gpu/faithful_ut_memory.yaml RESULTS.jsonl

One look at the seeds that finished, decided as a fixed design at one-sided 0.05 (the sequential design's first
look would spend less of the level), with the per-cell table beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from studyrunner.analysis.claims import verdict_table, verify
from studyrunner.analysis.data import from_frame
from studyrunner.results import cell_summary
from studyrunner.study import compile_study, flatten_config, loads


def frame(study_file: Path, results: Path) -> tuple[pd.DataFrame, object, list[dict]]:
    """The finished trials as a trials frame, the study, and the rows of trials stopped at the deadline (left
    out: the look is over the seeds that finished)."""
    compiled = compile_study(loads(study_file.read_text()))
    cells = {c.cell_hash: c for c in compiled.cells}
    rows, unfinished = [], []
    for line in results.read_text().splitlines():
        row = json.loads(line)
        if row["status"] == "unfinished":
            unfinished.append(row)
            continue
        cell = cells[row["cell_hash"]]
        metrics = {k: v for k, v in row.items() if k not in {"cell_hash", "label", "overrides", "seed", "status"}}
        rows.append(
            {
                "study": compiled.study.name,
                "trial_key": f"{row['cell_hash']}-{row['seed']}",
                "cell_hash": row["cell_hash"],
                "cell": cell.label,
                "seed": row["seed"],
                "status": row["status"],
                **flatten_config(cell.config),
                **metrics,
            }
        )
    return pd.DataFrame(rows), compiled.study, unfinished


def main() -> None:
    trials, study, unfinished = frame(Path(sys.argv[1]), Path(sys.argv[2]))
    for row in unfinished:
        print(f"left out, stopped at step {row.get('step')}: {row['label']} seed {row['seed']}")
    if trials.empty:
        sys.exit("no trial finished: nothing to decide")
    data = from_frame(
        trials,
        name=study.name,
        metric=study.metric.name,
        mode=study.metric.mode,
        failure=study.failure,
        claims=[c.model_dump() if hasattr(c, "model_dump") else c for c in study.claims],
    )
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60):
        print(cell_summary(data.trials, data.metric, data.mode).to_string())
        print(verdict_table(verify(data)).to_string())


if __name__ == "__main__":
    main()
