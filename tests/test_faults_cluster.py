"""Node loss: a two-node Ray cluster (ray.cluster_utils.Cluster, real raylets) loses the node running the
trials mid-study; the trials are retried on a node that joins, resume from their checkpoints, and the
study completes with every trial succeeded once in the ledger and in MLflow."""

from __future__ import annotations

import threading
import time

import pytest
from test_faults import study_text, trial_runs, without_timing

from studyrunner.orchestrate import submit
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.train import run_trial
from studyrunner.workspace import Workspace

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    from studyrunner.orchestrate.cluster.ray_runtime import quiet_ray_env

    quiet_ray_env()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    worker = c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c, worker
    ray.shutdown()
    c.shutdown()


def test_losing_the_node_that_runs_the_trials_does_not_lose_the_study(cluster, tmp_path):
    c, worker = cluster
    ws = Workspace.resolve(tmp_path)
    text = study_text("nodeloss", steps=1200, seeds="[0]").replace("log_every", "checkpoint_every: 100, log_every")
    compiled = compile_study(loads(text))
    ledger = Ledger(ws.db_url)
    lost: dict[str, object] = {}
    outcome: list = []
    # The study runs in a thread: Ray adds and removes nodes only from the main thread.
    driver = threading.Thread(target=lambda: outcome.append(submit(compiled, ws, show_progress=False)), daemon=True)
    driver.start()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not lost:
        rows = ledger.trials("nodeloss") if ledger.studies() else []
        running = sorted(r.trial_key for r in rows if r.status == "running")
        if running and all(list((tmp_path / "checkpoints" / "nodeloss" / k).glob("step-*.ckpt")) for k in running):
            lost["running"] = running  # mid-training, each past a checkpoint (however slow the machine)
            c.remove_node(worker)
            c.add_node(num_cpus=2)
        time.sleep(0.2)
    driver.join(timeout=300)
    (result,) = outcome
    assert lost.get("running"), "the node was never removed while a trial ran"
    assert sorted(result.succeeded) == sorted(t.trial_key for t in compiled.trials)
    rows = {r.trial_key: r for r in ledger.trials("nodeloss")}
    retried = [k for k in lost["running"] if rows[k].attempts > 1]
    assert retried, "no trial was running on the lost node"
    for key in retried:
        attempts = ledger.attempts(key)
        assert attempts[0].error_class == "infrastructure" and attempts[-1].status == "succeeded"
        trial = next(t for t in compiled.trials if t.trial_key == key)
        assert attempts[-1].resumed_from_step > 0  # from its checkpoint, not from step 0
        print(f"{key}: lost at attempt 1, resumed from step {attempts[-1].resumed_from_step}")
        assert without_timing(rows[key].metrics) == without_timing(run_trial(trial.config, trial.seed))
    runs = trial_runs(ws, "nodeloss")
    assert sorted(runs) == sorted(rows) and all(len(v) == 1 for v in runs.values())
