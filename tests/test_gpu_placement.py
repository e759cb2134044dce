"""Fractional GPUs: `resources: {gpu: 0.125}` places several packs on one GPU at once.

Ray is started with one *logical* GPU on this CPU machine (`ray.init(num_gpus=1)`: Ray schedules by the
count it is told, and sets CUDA_VISIBLE_DEVICES for each worker as on a GPU node); the trials train on the
CPU (`train.device: cpu`), so what is checked is the placement, not CUDA. In its own process: the Ray
session other end-to-end tests share has no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import TINY_STUDY

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import ray
    from studyrunner.orchestrate import submit
    from studyrunner.store import Ledger
    from studyrunner.study import compile_study, loads
    from studyrunner.workspace import Workspace

    ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    compiled = compile_study(loads(open(sys.argv[1]).read()))
    ws = Workspace.resolve(sys.argv[2])
    result = submit(compiled, ws, show_progress=False)
    ledger = Ledger(ws.db_url)
    attempts = [
        {"trial": a.trial_key, "ray_trial": a.ray_trial_id, "provenance": a.provenance,
         "started": a.started_at.isoformat(), "ended": a.ended_at.isoformat()}
        for t in compiled.trials for a in ledger.attempts(t.trial_key)
    ]
    print("RESULT " + json.dumps({"succeeded": len(result.succeeded), "attempts": attempts}))
    """
)


def test_fractional_gpus_place_several_packs_on_one_gpu(tmp_path):
    # 2 cells x 4 seeds, packs of 2 seeds: 4 packs, each asking for 1/8 of a GPU and 1/4 of a CPU
    study = (
        TINY_STUDY.replace("name: tiny", "name: fractional")
        .replace("seeds: [0, 1]", "seeds: [0, 1, 2, 3]")
        .replace("grad_clip: 1.0,", "grad_clip: 1.0, pack: seeds, pack_size: 2, device: cpu,")
        .replace("steps: 12,", "steps: 120,")
        .replace("resources: {cpu: 1, gpu: 0}", "resources: {cpu: 0.25, gpu: 0.125}")
    )
    path = tmp_path / "study.yaml"
    path.write_text(study)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), str(tmp_path / "ws")], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(li for li in done.stdout.splitlines() if li.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["succeeded"] == 8
    packs: dict[str, list[dict]] = {}
    for attempt in result["attempts"]:
        packs.setdefault(attempt["ray_trial"], []).append(attempt)
    assert len(packs) == 4 and all(len(members) == 2 for members in packs.values())
    for members in packs.values():
        placed = members[0]["provenance"]
        assert json.loads(placed["ray_resources"]) == {"CPU": 0.25, "GPU": 0.125}
        assert placed["ray_gpu_ids"] == "0"  # the one GPU, shared
    # the packs ran side by side on it: each one's attempt overlaps another's
    spans = [(m[0]["started"], m[0]["ended"]) for m in packs.values()]
    overlapping = [a for a in spans if any(b != a and b[0] < a[1] and a[0] < b[1] for b in spans)]
    assert len(overlapping) >= 2
