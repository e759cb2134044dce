"""Trial workers that are warm before a study asks for them.

A Tune trial's actor is a Ray worker process. Started cold, it imports torch, Ray Tune and the trainer
(~2.5 s on an idle core of the project's VM), and its first optimizer imports torch._dynamo (~1.1 s), once
per slot and submit; a study of a few seconds a trial lost a fifth of its wall time to that
(benchmarks/utilisation.py; docs/performance.md has the figures).

Ray starts one idle Python worker per CPU when it starts, and its `preload_python_modules` setting
(experimental, Ray >= 2.4: https://github.com/ray-project/ray/pull/33572) makes every Python worker import
the listed modules before it takes work. The embedded Ray is started with both in that list
(`system_config`, used by ray_runtime.py), so its idle workers load the trainer while the driver registers
the study and opens MLflow, and the trial actors find it loaded. On a cluster the same setting is an
environment variable of `ray start`:
`RAY_preload_python_modules=studyrunner.orchestrate.cluster.trainable,torch._dynamo` (docs/guide/clusters.md),
with `RAY_idle_worker_killing_time_threshold_ms=60000` so that Ray keeps them until they are asked for.
`STUDYRUNNER_WARM_WORKERS=0` turns it off (each idle worker then stays at Ray's ~60 MB instead of holding
torch, ~300 MB).

An actor lands on one of those idle workers only if its runtime environment is theirs, i.e. empty. Ray
Tune gives every trainable's actor class `env_vars: {PL_DISABLE_FORK: "1"}` (ray/tune/execution/
class_cache.py, a PyTorch Lightning fix: https://github.com/ray-project/ray/issues/28197), which sends every
trial actor to a new, cold process. studyrunner trains without Lightning, so `tune_actors_on_warm_workers`
leaves that variable out while a study's Tune run creates its actors. The variables Tune copies from the
driver's environment (cloud credentials, Ray Train's settings) still go with the actors, which then start
cold; so does everything on a Ray whose Tune lacks that table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from ...settings import switch

# torch.optim's first optimizer imports torch._dynamo (~1.1 s on an idle core here): every trial builds one.
PRELOAD = ("studyrunner.orchestrate.cluster.trainable", "torch._dynamo")
LIGHTNING_ONLY = ("PL_DISABLE_FORK",)
# Ray ends an idle worker it counts as surplus after 1 s; while Tune reserves the CPUs for its trials that
# took the preloaded workers away just before the trial actors asked for them (2 of 5 submits here).
IDLE_KEPT_MS = 60_000
SWITCH = "STUDYRUNNER_WARM_WORKERS"  # read by `enabled`


def enabled() -> bool:
    return switch(SWITCH, True)


def system_config() -> dict[str, object]:
    """Ray's `_system_config` for the embedded Ray: its Python workers load the trainer as they start."""
    if not enabled():
        return {}
    return {"preload_python_modules": list(PRELOAD), "idle_worker_killing_time_threshold_ms": IDLE_KEPT_MS}


@contextmanager
def tune_actors_on_warm_workers() -> Iterator[None]:
    """While inside, Ray Tune creates trainable actors without the Lightning-only environment variable, so
    they can take Ray's idle (preloaded) workers."""
    try:
        from ray.tune.execution import class_cache

        defaults = class_cache.DEFAULT_ENV_VARS
    except (ImportError, AttributeError):  # another Ray: its trial actors start cold
        yield
        return
    dropped = {name: defaults.pop(name) for name in LIGHTNING_ONLY if name in defaults} if enabled() else {}
    try:
        yield
    finally:
        defaults.update(dropped)


def process_facts() -> dict[str, str]:
    """The worker process an attempt ran in: its pid, when it started (UTC, ISO 8601: before the submit for a
    warm worker) and how long it had been up when the attempt first reported (seconds)."""
    try:
        import psutil

        started = psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - psutil missing or no /proc: the pid alone
        return {"pid": str(os.getpid())}
    return {
        "pid": str(os.getpid()),
        "process_started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="milliseconds"),
        "process_age_s": f"{time.time() - started:.2f}",
    }
