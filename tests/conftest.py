import textwrap
from pathlib import Path

import pytest
import torch

# A study small enough to train in seconds: the shape of studies/quickstart.yaml at toy size.
TINY_STUDY = """\
name: tiny
description: toy looped vs unlooped
task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 12, batch_size: 16, lr: 1.0e-3, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, log_every: 4}
eval: {every: 6, examples: 32}
grid:
  model.params.loops: [1, 2]
seeds: [0, 1]
resources: {cpu: 1, gpu: 0}
metric: {name: eval_accuracy, mode: max}
"""


@pytest.fixture
def write_study(tmp_path: Path):
    def write(text: str, name: str = "study.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(autouse=True)
def one_thread():
    """CPU results depend on the thread count; tests train with one, as a `cpu: 1` trial does."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_sudoku_pools(tmp_path, monkeypatch):
    """Sudoku pools in chunks of 64 (fast), cached under a fresh folder; in-process cache cleared around it."""
    import studyrunner.tasks.sudoku as sudoku

    monkeypatch.setenv("STUDYRUNNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("STUDYRUNNER_SUDOKU_CACHE", raising=False)
    monkeypatch.setattr(sudoku, "CHUNK", 64)
    sudoku._pool.cache_clear()
    yield
    sudoku._pool.cache_clear()


# ---- the two test layers -------------------------------------------------------------------------------------
# `pytest -m "not e2e"` is the fast layer: it starts no Ray, no server and no subprocess, so a change can be
# checked in minutes. A test that needs real processes is marked `e2e` (module-level `pytestmark`, or per test).
# The guard below holds the fast layer to that: a test without the marker that starts a process fails and says
# which, so a slow test cannot slip into the fast layer unnoticed. (`git` and `uname`, read-only and instant, are
# allowed: a trial's provenance asks git for the commit, and `platform` asks uname for the processor.)

_ALLOWED_PROGRAMS = {"git", "uname"}


class _ProcessWatch:
    """Records processes started (subprocess, fork, multiprocessing) and whether Ray came up, while armed."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.armed = False

    def refuse(self, what: str) -> None:
        # Raised at once, so a misplaced test fails in a second instead of running its processes; recorded too,
        # in case the code under test swallows the error.
        self.started.append(what)
        raise RuntimeError(f"the fast test layer starts no process ({what}): mark this test e2e")

    def install(self) -> None:
        import multiprocessing.process
        import os
        import subprocess

        watch = self
        popen_init = subprocess.Popen.__init__
        fork = os.fork
        mp_start = multiprocessing.process.BaseProcess.start

        def spy_popen(self, args, *a, **k):
            if watch.armed:
                argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
                program = os.path.basename(str(argv[0]).split()[0]) if argv else "?"
                if program not in _ALLOWED_PROGRAMS:
                    watch.refuse(" ".join(str(a) for a in argv)[:120])
            return popen_init(self, args, *a, **k)

        def spy_fork():
            if watch.armed:
                watch.refuse("os.fork()")
            return fork()

        def spy_mp_start(self):
            if watch.armed:
                watch.refuse(f"multiprocessing {self.name}")
            return mp_start(self)

        subprocess.Popen.__init__ = spy_popen
        os.fork = spy_fork
        multiprocessing.process.BaseProcess.start = spy_mp_start


_WATCH = _ProcessWatch()
_RAY_BEFORE = pytest.StashKey[bool]()


def pytest_configure(config):
    _WATCH.install()


def _ray_up() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


# Armed while a fast test sets up and runs, not while it tears down: the last test of a module tears down the
# module's fixtures, which an end-to-end test of that module may have started (a PostgreSQL server, a Ray).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _WATCH.started.clear()
    item.stash[_RAY_BEFORE] = _ray_up()
    _WATCH.armed = item.get_closest_marker("e2e") is None
    yield
    _WATCH.armed = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _WATCH.armed = item.get_closest_marker("e2e") is None
    yield
    _WATCH.armed = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if item.get_closest_marker("e2e") is not None or report.failed or call.when != "call":
        return
    started = list(_WATCH.started)  # a refusal the code under test swallowed
    if _ray_up() and not item.stash.get(_RAY_BEFORE, False):
        started.append("ray.init()")
    if started:
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid}: a fast-layer test started {started[0]!r}; mark it e2e"


# ---- one Ray for the end-to-end layer -------------------------------------------------------------------------
# Starting Ray costs seconds and ~1.4 GB; tests that only need *a* Ray share this one. Collection puts them last,
# together, so the shared Ray is up only while they run and no other test finds it running (a test that checks
# the embedded Ray a command starts and stops, or starts one of another size, runs before it or in a subprocess).


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from studyrunner.orchestrate import ensure_ray

    ensure_ray(num_cpus=2)
    yield
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: "ray_session" in getattr(item, "fixturenames", ()))  # stable: order kept within
