"""A study on a real multi-node cluster, started with the manual's "Running on a cluster" lines.

On this one machine: a Ray head (`ray start --head`, no CPUs) and two worker nodes (`ray start --address`),
each worker in its own UTS namespace so its hostname differs (`unshare --uts`, root only); the ledger and
MLflow's store on a throwaway PostgreSQL (two databases); an `mlflow server` on it; `moto_server` as the
S3 object store behind `--storage s3://...`. The manual's lines (docs/guide/clusters.md) run as they are,
with the test's values for their variables and, after them, what one shared machine needs (ports of its
own, a `--temp-dir` of its own, `--block`, one CPU per worker): click takes an option's last value. A toy study saved as
`studies/quickstart.yaml` stands in for the real one, so the submit line needs no edit either.

Nothing here calls `ray stop` (it stops every Ray on the machine, other tests' included): each node is its
`ray start --block` process, stopped by a signal to its process group.
"""

from __future__ import annotations

import contextlib
import itertools
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
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import TINY_STUDY
from test_faults import without_timing
from test_ledger import postgres_url  # noqa: F401 - the fixture: a throwaway PostgreSQL server

from studyrunner.store import STATUSES, CurveStore, Ledger
from studyrunner.study import compile_study, loads
from studyrunner.train import run_trial

CLUSTER_PAGE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "clusters.md"
BIN = Path(sys.executable).parent  # ray, mlflow, moto_server, studyrunner: the venv's own
BUCKET = "studyrunner"  # the manual's bucket
STORAGE = f"s3://{BUCKET}/workspace"
WORKERS = ("sr-node-1", "sr-node-2")
ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")
START_S = 240  # the longest any one service may take to come up on a loaded machine
SUBMIT_S = 900

# The toy study: 2 cells x 2 seeds of one CPU each, so the two one-CPU workers each run some of them.
STUDY = TINY_STUDY.replace("name: tiny", "name: quickstart").replace("log_every", "checkpoint_every: 6, log_every")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------- the manual's lines


def readme_commands() -> dict[str, list[str]]:
    """The commands of the manual's cluster block, by what they start: 'head', 'worker', 'mlflow',
    'submit', 'status', 'results' (each a shell line, continuations joined, comment dropped)."""
    text = CLUSTER_PAGE.read_text()
    section = text[text.index("## Running on a cluster") :]
    block = re.search(r"\*\*Without containers\*\*.*?```bash\n(.*?)```", section, re.S)
    assert block, "docs/guide/clusters.md 'Running on a cluster' has no 'Without containers' bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    found: dict[str, list[str]] = {}
    for line in lines:
        words = shlex.split(line, comments=True)
        env = list(itertools.takewhile(ASSIGNMENT.fullmatch, words))  # `NAME=value command ...`
        words = words[len(env) :]
        if words[:2] == ["ray", "start"]:
            role = "head" if "--head" in words else "worker"
        elif words[:2] == ["mlflow", "server"]:
            role = "mlflow"
        elif words[:1] == ["studyrunner"]:
            role = words[1]
        else:
            continue  # assignments, exports, `ray stop`
        assert role not in found, f"the manual's cluster block has two {role!r} lines"
        found[role] = env + words
    assert set(found) == {"head", "worker", "mlflow", "submit", "status", "results"}, sorted(found)
    return found


def expand(words: list[str], values: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of a line of the manual with its $VARIABLES set to `values`; the
    program is the venv's."""

    def sub(word: str) -> str:
        def one(m: re.Match) -> str:
            name = m.group(1) or m.group(2)
            assert name in values, f"the manual's cluster block uses ${name}, which the test does not set"
            return values[name]

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, word)

    words = [sub(w) for w in words]
    assignments = list(itertools.takewhile(ASSIGNMENT.fullmatch, words))
    env, argv = dict(w.split("=", 1) for w in assignments), words[len(assignments) :]
    return env, [str(BIN / argv[0]), *argv[1:]]


def test_readme_block_has_the_cluster_commands():
    commands = readme_commands()
    assert "--num-cpus=0" in commands["head"]  # the head runs no trials
    submit = commands["submit"]
    for option in ("--address", "--db", "--tracking-uri", "--storage"):
        assert any(w.startswith(f"{option}=") for w in submit), option
    assert "--storage=s3://studyrunner/workspace" in submit  # a URI, not a folder the nodes could share


# ---------------------------------------------------------------------------------- storage URIs


def test_a_storage_uri_with_options_is_refused_in_one_line_before_anything_is_written(tmp_path):
    from typer.testing import CliRunner

    from studyrunner.cli import app

    study, ws = tmp_path / "s.yaml", tmp_path / "ws"
    study.write_text(TINY_STUDY)
    uri = "s3://studyrunner/workspace?endpoint_override=127.0.0.1:9000&scheme=http"
    result = CliRunner().invoke(app, ["submit", str(study), "--workspace", str(ws), "--storage", uri])
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert "--storage" in line and "options after '?'" in line and "AWS_ENDPOINT_URL" in line
    assert not ws.exists()


def test_an_unreachable_s3_store_without_an_endpoint_names_the_variable(monkeypatch):
    from studyrunner.errors import StudyrunnerError
    from studyrunner.workspace import check_storage

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "none")  # no credential or region lookups on this machine
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "none")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # AWS itself (unreachable here; elsewhere it refuses these credentials): the hint names the variable.
    with pytest.raises(StudyrunnerError, match="cannot write to.*set AWS_ENDPOINT_URL"):
        check_storage("s3://studyrunner-no-such-bucket/workspace")


# ---------------------------------------------------------------------------------- processes


@dataclass
class Services:
    """The processes the test started (each the leader of its own process group) and their logs."""

    logs: Path
    ray_temp: Path
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")  # noqa: SIM115 - kept open for the process's life
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def wait_for(self, name: str, ready, what: str, timeout: float = START_S) -> None:
        proc = dict(self.procs)[name]
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"{name} exited ({proc.returncode}) before {what}:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name}: not {what} after {timeout:.0f} s:\n{self.log(name)}"
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM every group (a `ray start --block` stops the Ray processes it started), newest first;
        SIGKILL what is left; then any process still naming this cluster's temp folder (Ray's own)."""
        for _name, proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for _name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in processes_naming(str(self.ray_temp)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.ray_temp, ignore_errors=True)


def processes_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose command line contains `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def in_own_uts_namespace(hostname: str, argv: list[str]) -> list[str]:
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname, *argv]


NODES = """
import json, sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 120
while len(alive := [n for n in ray.nodes() if n["Alive"]]) < int(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.5)
print(json.dumps(sorted([n["NodeManagerHostname"], n["Resources"].get("CPU", 0.0)] for n in alive)))
"""


# ---------------------------------------------------------------------------------- the cluster


@dataclass(frozen=True)
class Cluster:
    values: dict[str, str]  # the manual's variables
    env: dict[str, str]  # what every process here gets
    s3: object  # a boto3 client of the object store
    cwd: Path  # where the manual's lines run (holds studies/quickstart.yaml)
    local: tuple[Path, ...]  # every local folder the study could have written to
    services: Services


@pytest.fixture(scope="module")
def cluster(postgres_url, tmp_path_factory):  # noqa: F811
    pytest.importorskip("boto3")
    if shutil.which("moto_server", path=str(BIN)) is None:
        pytest.skip("moto_server not installed (the dev extra's moto[server])")
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode:
        pytest.skip("`unshare --uts` not permitted (needs root): worker nodes could not have hostnames of their own")
    import boto3
    import psycopg

    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("CREATE DATABASE mlflow")
    ledger_url = postgres_url
    mlflow_db = postgres_url.rsplit("/", 1)[0] + "/mlflow"

    base = tmp_path_factory.mktemp("cluster")
    cwd, logs = base / "run", base / "logs"
    (cwd / "studies").mkdir(parents=True)
    logs.mkdir()
    (cwd / "studies" / "quickstart.yaml").write_text(STUDY)
    ray_temp = Path(tempfile.mkdtemp(prefix="srcl-", dir="/tmp"))  # Ray's socket paths must stay short
    services = Services(logs, ray_temp)

    s3_port, ray_port, mlflow_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUDYRUNNER_", "MLFLOW_", "RAY_", "AWS_"))}
    env.update(
        RAY_AUTH_MODE="disabled",  # Ray 2.60 would write an auth token under $HOME
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",  # a stopped node goes at once, not after a 30 s drain
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",  # no instance-metadata lookups for credentials or region
    )
    values = {
        "HEAD": f"127.0.0.1:{ray_port}",
        "LEDGER": ledger_url,
        "MLFLOW_DB": mlflow_db,
        "MLFLOW_HOST": f"127.0.0.1:{mlflow_port}",
    }
    commands = readme_commands()
    try:
        # The object store, and the manual's bucket in it.
        services.start("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(s3_port)], env, cwd)
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        services.wait_for("s3", lambda: http_ok(f"{env['AWS_ENDPOINT_URL']}/moto-api/"), "serving S3")
        s3.create_bucket(Bucket=BUCKET)

        # The tracking server (it creates its tables meanwhile).
        extra, argv = expand(commands["mlflow"], values)
        services.start("mlflow", [*argv, "--host=127.0.0.1", f"--port={mlflow_port}"], {**env, **extra}, cwd)

        # The head, then each worker in turn (two raylets starting at once in one temp folder can race).
        def node(argv: list[str], *own: str) -> list[str]:
            ports = [f"--dashboard-agent-listen-port={free_port()}", "--min-worker-port=0", "--max-worker-port=0"]
            return [*argv, *own, f"--temp-dir={ray_temp}", "--object-store-memory=100000000", *ports, "--block"]

        extra, argv = expand(commands["head"], values)
        own = [f"--port={ray_port}", f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}"]
        services.start("head", node(argv, *own, "--include-dashboard=false"), {**env, **extra}, cwd)
        services.wait_for("head", lambda: "Ray runtime started" in services.log("head", 10**6), "started")
        for host in WORKERS:
            extra, argv = expand(commands["worker"], values)
            services.start(host, in_own_uts_namespace(host, node(argv, "--num-cpus=1")), {**env, **extra}, cwd)
            services.wait_for(host, lambda h=host: "Ray runtime started" in services.log(h, 10**6), "started")
        services.wait_for("mlflow", lambda: http_ok(f"http://127.0.0.1:{mlflow_port}/health"), "healthy")
        probe = [sys.executable, "-c", NODES, values["HEAD"], str(1 + len(WORKERS))]
        done = subprocess.run(probe, env=env, cwd=cwd, capture_output=True, text=True, timeout=START_S)
        assert done.returncode == 0, done.stderr[-3000:]
        nodes = json.loads(done.stdout.splitlines()[-1])
        assert nodes == sorted([[socket.gethostname(), 0.0], *([h, 1.0] for h in WORKERS)]), nodes

        yield Cluster(values, env, s3, cwd, (base, ray_temp), services)
    finally:
        services.stop()


def run_readme(cluster: Cluster, role: str, *more: str, timeout: float = 300) -> subprocess.CompletedProcess:
    extra, argv = expand(readme_commands()[role], cluster.values)
    return subprocess.run(
        [*argv, *more], env={**cluster.env, **extra}, cwd=cluster.cwd, capture_output=True, text=True, timeout=timeout
    )


def bucket_keys(cluster: Cluster, prefix: str) -> list[str]:
    pages = cluster.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = (o["Key"] for page in pages for o in page.get("Contents", []))
    return sorted(k for k in keys if not k.endswith("/"))  # not the empty markers of "folders" pyarrow makes


@pytest.mark.e2e
def test_a_study_on_a_multi_node_cluster_with_postgres_mlflow_server_and_object_store(cluster, monkeypatch):
    compiled = compile_study(loads(STUDY))
    keys = sorted(t.trial_key for t in compiled.trials)
    started = time.monotonic()
    done = run_readme(cluster, "submit", "--no-progress", timeout=SUBMIT_S)
    print(f"submit on the cluster: {time.monotonic() - started:.1f} s")
    (cluster.services.logs / "submit.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "View run" not in done.stdout  # MLflow's two lines per ended run, against a server

    # The ledger, on PostgreSQL: every trial succeeded, once, on a worker node; both workers ran some.
    ledger = Ledger(cluster.values["LEDGER"], create=False)
    rows = {r.trial_key: r for r in ledger.trials("quickstart")}
    assert sorted(rows) == keys
    assert {r.status for r in rows.values()} == {"succeeded"}
    hosts = {}
    for key in keys:
        (attempt,) = ledger.attempts(key)
        assert attempt.status == "succeeded" and attempt.host == attempt.provenance["host"]
        hosts[key] = attempt.host
    print("hosts:", hosts)
    assert set(hosts.values()) == set(WORKERS)  # more than one node, and never the head

    # The same trials in one process here: the same final metrics (wall-clock figures aside).
    for trial in compiled.trials:
        alone = run_trial(trial.config, trial.seed)
        assert without_timing(rows[trial.trial_key].metrics) == without_timing(alone), trial.trial_key

    # Curves, checkpoints and MLflow artifacts are in the object store, and nothing of theirs on local disk.
    curves = bucket_keys(cluster, "workspace/curves/quickstart/")
    assert curves == [f"workspace/curves/quickstart/{k}.parquet" for k in keys]
    checkpoints = bucket_keys(cluster, "workspace/checkpoints/quickstart/")
    assert checkpoints == [f"workspace/checkpoints/quickstart/{k}/step-{s:09d}.ckpt" for k in keys for s in (6, 12)]
    artifacts = bucket_keys(cluster, "workspace/mlartifacts/quickstart/")
    assert sum(a.endswith("/artifacts/study.yaml") for a in artifacts) >= len(keys), artifacts
    assert bucket_keys(cluster, "workspace/ray/"), "no Ray Tune folder in the store"
    for folder in cluster.local:
        names = ("curves", "checkpoints", "mlartifacts")
        assert [p for p in folder.rglob("*") if p.suffix in (".parquet", ".ckpt") or p.name in names] == []

    # MLflow, asked over HTTP: one run per trial, holding exactly its curve's points.
    from mlflow import MlflowClient

    client = MlflowClient(f"http://{cluster.values['MLFLOW_HOST']}")
    experiment = client.get_experiment_by_name("quickstart")
    assert experiment.artifact_location == f"{STORAGE}/mlartifacts/quickstart"
    runs = client.search_runs([experiment.experiment_id], "tags.kind = 'trial'", max_results=100)
    assert sorted(r.data.tags["trial_key"] for r in runs) == keys
    for name, value in cluster.env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)  # the curves are read here, from the store, as analyze reads them
    store = CurveStore(STORAGE)
    for run in runs:
        key = run.data.tags["trial_key"]
        assert run.info.run_id == rows[key].mlflow_run_id and run.info.status == "FINISHED"
        curve = store.read("quickstart", key)
        metrics = [c for c in curve.columns if c not in ("trial_key", "step")]
        assert {"train_loss", "eval_accuracy"} <= set(metrics)
        for name in metrics:
            points = curve[["step", name]].dropna()
            history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
            assert history == list(zip(points["step"].tolist(), points[name].tolist(), strict=True)), (key, name)
        # The server reads the run's artifacts from the store too (the UI's request).
        url = f"http://{cluster.values['MLFLOW_HOST']}/ajax-api/2.0/mlflow/artifacts/list?run_uuid={run.info.run_id}"
        with urllib.request.urlopen(url, timeout=30) as r:
            listed = {f["path"] for f in json.load(r).get("files", [])}
        assert {"study.yaml", "resolved_config.json"} <= listed, listed

    # `status` and `results` read the PostgreSQL ledger.
    status = run_readme(cluster, "status")
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if "quickstart" in line)
    counts = dict(zip(STATUSES, re.findall(r"\d+", row), strict=False))
    assert counts["succeeded"] == str(len(keys)) and {v for s, v in counts.items() if s != "succeeded"} == {"0"}
    assert "read from ledger postgresql+psycopg://" in status.stdout + status.stderr
    results = run_readme(cluster, "results")
    assert results.returncode == 0, results.stderr
    table = {r["trial_key"]: r for r in json.loads(results.stdout)}
    assert sorted(table) == keys
    for key in keys:
        assert table[key]["status"] == "succeeded"
        assert table[key]["eval_accuracy"] == rows[key].metrics["eval_accuracy"]
