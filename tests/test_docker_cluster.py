"""The compose cluster for real: build the images, start docker/compose.yaml with docker/compose.offline.yaml
(every image from a local Debian base, no registry needed), run a study through it, and check the ledger in its
PostgreSQL, Ray's token authentication and that no secret is on any process's command line.

Opt-in, and never part of the default suite: it needs a Docker engine and takes minutes (a build with a warm
cache ~1.5 min, the cluster ~30 s, the study ~1 min on 2 cores). Run it with

    STUDYRUNNER_DOCKER_TESTS=1 .venv/bin/python -m pytest -m docker tests/test_docker_cluster.py

The base image (STUDYRUNNER_DOCKER_BASE_IMAGE, default studyrunner-base:bookworm) is made with
docker/offline/base-image.sh when it is missing (root and debootstrap needed). Where PyTorch's index cannot be
reached, the torch wheel must be in docker/wheels/ (and a TLS-intercepting proxy's CA in docker/certs/): see
docker/README.md, "Without registries".
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import TINY_STUDY

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
BASE_IMAGE = os.environ.get("STUDYRUNNER_DOCKER_BASE_IMAGE", "studyrunner-base:bookworm")
PROJECT = f"srtest{os.getpid()}"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.docker,
    pytest.mark.skipif(
        os.environ.get("STUDYRUNNER_DOCKER_TESTS") != "1",
        reason="builds images and runs a compose cluster: set STUDYRUNNER_DOCKER_TESTS=1 (needs a Docker engine)",
    ),
]


def docker(*args: str, timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check:
        assert done.returncode == 0, f"docker {' '.join(args[:4])}...: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    if not shutil.which("docker") or docker("info", check=False, timeout=30).returncode:
        pytest.skip("no Docker engine answers")
    if docker("compose", "version", check=False).returncode:
        pytest.skip("docker compose (v2) is not installed")
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip(f"no image {BASE_IMAGE}: make it with docker/offline/base-image.sh (root, debootstrap)")
        subprocess.run([str(DOCKER / "offline" / "base-image.sh"), BASE_IMAGE], check=True, timeout=1200)
    env = {
        **os.environ,
        "DOCKER_BUILDKIT": "0",
        "COMPOSE_FILE": f"{DOCKER / 'compose.yaml'}{os.pathsep}{DOCKER / 'compose.offline.yaml'}",
        "COMPOSE_PROJECT_NAME": PROJECT,
        "BASE_IMAGE": BASE_IMAGE,
        "RAY_WORKERS": "2",
        "RAY_WORKER_CPUS": "1",
        # Ports of their own on 127.0.0.1: a cluster or an embedded Ray of this machine keeps its own.
        **{name: str(free_port()) for name in ("RAY_DASHBOARD_PORT", "MLFLOW_PORT", "POSTGRES_PORT")},
        **{name: str(free_port()) for name in ("MINIO_PORT", "MINIO_CONSOLE_PORT")},
    }
    build = ["build", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    docker(*build, "-f", str(DOCKER / "Dockerfile.cpu"), "-t", "studyrunner:cpu", str(ROOT), timeout=3600, env=env)
    for name, tag in (("postgres", "studyrunner-postgres:bookworm"), ("s3", "studyrunner-s3:bookworm")):
        docker(*build, "-f", str(DOCKER / "offline" / f"Dockerfile.{name}"), "-t", tag, str(DOCKER), env=env)
    try:
        docker("compose", "up", "-d", "--wait", timeout=900, env=env)
        yield env
    finally:
        docker("compose", "down", "-v", "--remove-orphans", timeout=300, check=False, env=env)


def compose(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    return docker("compose", *args, timeout=timeout, env=env).stdout


def read_secret(env: dict[str, str], name: str) -> str:
    """A secret the service `secrets` made, read as the images' user from inside the cluster."""
    return compose(env, "exec", "-T", "ray-head", "cat", f"/secrets/{name}")


class CommandLines:
    """Every process's command line on the host while a block runs, as `ps` shows them to every user."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    pass
            time.sleep(0.25)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def test_a_study_runs_through_the_cluster_with_no_secret_on_a_command_line(cluster):
    studies = Path(tempfile.mkdtemp(prefix="srdocker-"))
    try:
        studies.chmod(0o755)  # read by the images' user, uid 1000
        (studies / "tiny.yaml").write_text(TINY_STUDY)
        (studies / "tiny.yaml").chmod(0o644)
        with CommandLines() as lines:
            done = docker(
                "compose", "run", "--rm", "-T", "-v", f"{studies}:/studies:ro", "submit", "/studies/tiny.yaml",
                timeout=1200, check=False, env=cluster,
            )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    finally:
        shutil.rmtree(studies, ignore_errors=True)
    # The ledger, in the cluster's PostgreSQL: every trial of the study succeeded.
    query = "select status, count(*) from trials where study = 'tiny' group by status"
    rows = compose(cluster, "exec", "-T", "postgres", "psql", "-U", "studyrunner", "-d", "studyrunner", "-tAc", query)
    assert rows.split() == ["succeeded|4"], rows
    # The secrets: files of uid 1000, mode 0600, and on no command line, the study's worker processes included.
    secrets = {name: read_secret(cluster, name) for name in ("ray-auth-token", "postgres-password")}
    secrets["minio-root-password"] = read_secret(cluster, "minio-root-password")
    assert all(len(value) == 64 for value in secrets.values())
    modes = compose(cluster, "exec", "-T", "ray-head", "stat", "-c", "%a %u %n", *(f"/secrets/{n}" for n in secrets))
    assert {line.split()[0] + " " + line.split()[1] for line in modes.splitlines()} == {"600 1000"}
    assert len(lines.seen) > 50  # the watcher saw the containers' processes
    for name, value in secrets.items():
        assert not [line for line in lines.seen if value in line], f"the {name} is on a command line"


def test_the_clusters_ray_refuses_whoever_has_not_its_token(cluster):
    token = read_secret(cluster, "ray-auth-token")
    # The workers and the submitting client joined with the token: every node is alive.
    script = "import ray; ray.init(logging_level='ERROR'); print(len([n for n in ray.nodes() if n['Alive']]))"
    assert int(compose(cluster, "exec", "-T", "ray-head", "python", "-c", script).split()[-1]) >= 3
    # The dashboard (its job API runs code) without the token, with another one, with it.
    url = f"http://127.0.0.1:{cluster['RAY_DASHBOARD_PORT']}/api/jobs/"

    def status(headers: dict[str, str]) -> int:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:
                return answer.status
        except urllib.error.HTTPError as refused:
            return refused.code

    assert status({}) == 401
    assert status({"Authorization": "Bearer not-the-token"}) == 403
    assert status({"Authorization": f"Bearer {token}"}) == 200
    # A Ray client on the cluster's network: refused by the GCS, without a token and with another one.
    client = "import ray; ray.init(address='ray-head:6379', logging_level='ERROR'); print('joined')"
    for auth in ([], ["-e", "RAY_AUTH_MODE=token", "-e", "RAY_AUTH_TOKEN=not-the-token"]):
        network = f"{PROJECT}_default"
        done = docker(
            "run", "--rm", "--network", network, *auth, "studyrunner:cpu", "python", "-c", client,
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode != 0 and "joined" not in done.stdout, (auth, done.stdout)
        assert "InvalidAuthToken" in done.stderr, (auth, done.stderr[-2000:])
