"""Fail fast when no node of the Ray cluster can hold one trial: Tune would otherwise wait forever."""

from __future__ import annotations

from ...errors import StudyrunnerError

# What the Tune trial of a DeepSpeed trial reserves: it only drives a Ray Train run (orchestrate/cluster/distributed.py)
# whose resources.workers workers reserve resources.cpu, gpu and memory_gb each, so it takes no CPU (a share
# of one would keep the last whole-CPU worker off a full node: `workers: 2, cpu: 1` on 2 CPUs). Ray Tune
# cannot place a trial that asks for nothing at all, so it asks for one byte of memory.
DRIVER_REQUEST = {"memory": 1.0}


def trial_resources(resources, payload: dict | None = None) -> dict[str, float]:
    """Ray resource request of one Tune trial, from the study file's `resources:`; a DeepSpeed trial's (its
    payload names `workers`) is its Train driver's, as a placement-group bundle."""
    if payload is not None:
        if payload.get("workers"):
            return dict(DRIVER_REQUEST)
        plain = trial_resources(resources)
        return {"CPU": plain["cpu"], "GPU": plain["gpu"], "memory": plain.get("memory", 0)}
    request = {"cpu": resources.cpu, "gpu": resources.gpu}
    if resources.memory_gb:
        request["memory"] = resources.memory_gb * 1024**3
    return request


def _worker_request(resources) -> dict[str, float]:
    return {"CPU": resources.cpu, "GPU": resources.gpu, "memory": (resources.memory_gb or 0) * 1024**3}


def concurrent_runs(resources, cluster: dict | None = None) -> int:
    """How many DeepSpeed trials to keep in flight: as many whole runs as the cluster's resources hold (at
    least 1). More would only start Train drivers that wait for workers (Ray's Train-in-Tune guide)."""
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()
    per_run = {k: v * resources.workers for k, v in _worker_request(resources).items() if v}
    return max(1, int(min(cluster.get(k, 0) // v for k, v in per_run.items())))


def _workers_fit(resources, alive: list[dict]) -> bool:
    """Can every worker of one DeepSpeed trial be placed at once (packed into the nodes; its driver
    reserves nothing that counts)?"""
    wanted = {k: v for k, v in _worker_request(resources).items() if v}
    return sum(int(min(n.get(k, 0) // v for k, v in wanted.items())) for n in alive) >= resources.workers


def check_cluster_fits(resources, nodes: list[dict] | None = None) -> None:
    """Raise unless some alive node has every resource one trial asks for (`nodes`: `ray.nodes()`)."""
    if nodes is None:
        import ray

        nodes = ray.nodes()
    wanted = {"CPU": resources.cpu, "GPU": resources.gpu, "memory": (resources.memory_gb or 0) * 1024**3}
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(all(have.get(k, 0) >= v for k, v in wanted.items() if v) for have in alive):
        if resources.workers and not _workers_fit(resources, alive):
            total = sum(n.get("CPU", 0) for n in alive)
            raise StudyrunnerError(
                f"a DeepSpeed trial needs {resources.workers} workers of {resources.cpu:g} CPU"
                + (f", {resources.gpu:g} GPU" if resources.gpu else "")
                + (f", {resources.memory_gb:g} GB" if resources.memory_gb else "")
                + f" each (resources.workers, resources.cpu, ...) at once; "
                f"the Ray cluster ({total:g} CPU in all) cannot place them: lower resources.workers or "
                "resources.cpu, or add nodes"
            )
        return
    fields = {
        "CPU": ("resources.cpu", "CPU", 1),
        "GPU": ("resources.gpu", "GPU", 1),
        "memory": ("resources.memory_gb", "GB of memory", 1024**3),
    }
    for key, amount in wanted.items():
        if not amount:
            continue
        best = max((have.get(key, 0) for have in alive), default=0)
        if best < amount:
            field, unit, scale = fields[key]
            raise StudyrunnerError(
                f"the study asks for {amount / scale:g} {unit} per trial ({field}); "
                f"the largest node of the Ray cluster has {best / scale:g}: lower {field} or add nodes that have it"
            )
    raise StudyrunnerError(
        f"no single node of the Ray cluster has all of {resources.cpu:g} CPU, {resources.gpu:g} GPU"
        + (f" and {resources.memory_gb:g} GB" if resources.memory_gb else "")
        + " that one trial asks for (resources:); lower them or add a node that has them"
    )


def trials_at_once(resources, total: dict[str, float] | None = None) -> int:
    """How many trials the cluster holds at once (its CPUs and GPUs over one trial's); at least 1."""
    if total is None:
        import ray

        total = ray.cluster_resources()
    fits = [total.get("CPU", 0) // resources.cpu]
    if resources.gpu:
        fits.append(total.get("GPU", 0) // resources.gpu)
    return max(1, int(min(fits)))
