"""The quickstart, run as the README says, gives the README's table: the same trials, seeds a cell, verdicts,
differences, intervals and threats. The README's figures are what a fresh clone gets, or this test says which
figure moved (CPU results are deterministic for a study file and its seeds on one machine; a different CPU
may round a float differently, and then this test names the first figure that differs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
STUDYRUNNER = str(Path(sys.executable).with_name("studyrunner"))

# "| 1⊗4 > 1⊗1: looping ... | **supported**, sequential p 0.012 | +0.203 | [0.119, 0.286] | none |"
ROW = re.compile(
    r"^\| (?P<claim>[^|]+?) \| \*\*(?P<verdict>[a-z ()]+)\*\*[^|]* \| (?:slope )?(?P<diff>[+−-]?[\d.]+) \| "
    r"\[(?P<lo>[−-]?[\d.]+), (?P<hi>[−-]?[\d.]+)\] \| (?P<threats>[^|]+) \|$"
)
RUN = re.compile(r"stopped after \*\*(?P<looks>\d+) looks?, (?P<seeds>\d+) seeds a cell, (?P<trials>\d+) trials")


def _number(text: str) -> float:
    return float(text.replace("−", "-"))


def readme_quickstart() -> tuple[dict[str, int], list[dict]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## What the quickstart found", 1)[1].split("\n## ", 1)[0]
    run = RUN.search(section.replace("\n", " "))
    assert run, "the README's quickstart section no longer says 'stopped after **N looks, S seeds a cell, T trials'"
    rows = [m.groupdict() for line in section.splitlines() if (m := ROW.match(line.strip()))]
    assert rows, "the README's quickstart table has no claim rows this test can read"
    return {k: int(v) for k, v in run.groupdict().items()}, rows


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([STUDYRUNNER, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)


def test_the_quickstart_gives_the_readmes_table(tmp_path):
    expected_run, expected_rows = readme_quickstart()
    env = {**os.environ, "STUDYRUNNER_HOME": str(tmp_path / "ws")}  # the README's command, in a fresh workspace

    submitted = _cli("submit", "studies/quickstart.yaml", env=env)
    assert submitted.returncode == 0, submitted.stderr[-2000:]

    results = json.loads(_cli("results", "quickstart", "--format", "json", env=env).stdout)
    seeds_a_cell = max(sum(1 for r in results if r["cell_hash"] == c) for c in {r["cell_hash"] for r in results})
    looks = re.findall(r"look (\d+)", submitted.stderr + submitted.stdout)
    got_run = {"looks": max(map(int, looks)) if looks else 0, "seeds": seeds_a_cell, "trials": len(results)}
    assert got_run == expected_run, f"README says {expected_run}, a fresh run gave {got_run}"

    verified = _cli("verify", "quickstart", "--format", "json", env=env)
    claims = json.loads(verified.stdout)
    assert len(claims) == len(expected_rows)
    for row, claim in zip(expected_rows, claims, strict=True):
        where = f"README row {row['claim']!r}"
        assert claim["verdict"] == row["verdict"].split(" (")[0], f"{where}: verdict {claim['verdict']}"
        assert round(claim["difference"], 3) == pytest.approx(_number(row["diff"]), abs=1e-9), where
        assert round(claim["lo"], 3) == pytest.approx(_number(row["lo"]), abs=1e-9), where
        assert round(claim["hi"], 3) == pytest.approx(_number(row["hi"]), abs=1e-9), where
        threats = [t["threat"] for t in claim["validity"]]
        if row["threats"].startswith("none"):
            assert threats == [], f"{where}: a fresh run finds {threats}"
        else:
            assert all(t in row["threats"] for t in threats), f"{where}: a fresh run finds {threats}"
