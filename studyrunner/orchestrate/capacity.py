"""Fail fast when no node of the Ray cluster can hold one trial: Tune would otherwise wait forever."""

from __future__ import annotations

from ..errors import StudyrunnerError


def trial_resources(resources) -> dict[str, float]:
    """Ray resource request of one trial, from the study file's `resources:`."""
    request = {"cpu": resources.cpu, "gpu": resources.gpu}
    if resources.memory_gb:
        request["memory"] = resources.memory_gb * 1024**3
    return request


def check_cluster_fits(resources, nodes: list[dict] | None = None) -> None:
    """Raise unless some alive node has every resource one trial asks for (`nodes`: `ray.nodes()`)."""
    if nodes is None:
        import ray

        nodes = ray.nodes()
    wanted = {"CPU": resources.cpu, "GPU": resources.gpu, "memory": (resources.memory_gb or 0) * 1024**3}
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    if any(all(have.get(k, 0) >= v for k, v in wanted.items() if v) for have in alive):
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
