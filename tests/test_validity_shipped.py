"""`verify --format json` gives every claim of every shipped study its `validity` list:
each study file compiled and registered in a real SQLite ledger, its first seeds finished with made-up outcomes
for every metric its claims, failure rule and study metric name (no training: what is checked is that each claim
is assessed, on the study's own cells, tasks and selectors, not what the threats are)."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.store import Ledger
from studyrunner.study import load_and_compile
from studyrunner.study.claims_grammar import Number, parse_claim, parse_rule

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [
    p
    for p in sorted((ROOT / "studies").glob("*.yaml"))
    if (lambda s: s.claims and s.search is None)(load_and_compile(p).study)
]


def _metrics(study) -> set[str]:
    names = {study.metric.name, "effective_depth"}
    for entry in study.claims:
        claim = parse_claim(entry.claim)
        names |= {q.metric for q in claim.quantities if not isinstance(q, Number) and q.metric}
    if study.failure is not None:
        names |= set(parse_rule(study.failure).metrics)
    return names


def _value(metric: str, key: str) -> float | bool:
    """A made-up outcome in the metric's own range, different per trial."""
    u = (zlib.crc32(f"{metric} {key}".encode()) % 1000) / 1000
    if metric.endswith("collapsed"):
        return False
    if "loss" in metric or "bpc" in metric or "bpb" in metric:
        return 0.5 + u
    if "bytes" in metric or "perplexity" in metric:
        return 10.0 + 10 * u
    return 0.3 + 0.6 * u if "accuracy" in metric or "exact_match" in metric else u


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_verify_json_gives_every_claim_of_a_shipped_study_its_validity_list(path, tmp_path):
    compiled = load_and_compile(path)
    study = compiled.study
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.register(compiled)
    names = _metrics(study)
    for trial in compiled.trials:
        ledger.mark_running(trial.trial_key, f"run-{trial.trial_key}")
        ledger.mark_succeeded(trial.trial_key, {n: _value(n, trial.trial_key) for n in names})
    result = CliRunner().invoke(app, ["verify", study.name, "--workspace", str(tmp_path), "--format", "json"])
    assert result.exit_code in (0, 1), result.output
    rows = json.loads(result.stdout)
    assert len(rows) == len(study.claims)
    for row in rows:
        assert isinstance(row["validity"], list), row["claim"]
        for threat in row["validity"]:
            assert threat["threat"] in {"ceiling", "floor", "unconverged", "confound", "unmatched", "selection"}
            assert threat["detail"]
        assert row["lhs"] is None or math.isfinite(row["lhs"])
