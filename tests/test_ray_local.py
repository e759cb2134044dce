"""The embedded Ray of `submit` is this machine's alone, checked on a real submit while it
runs: every listening socket of every Ray process it started is on 127.0.0.1 (none answers on the machine's
other addresses), a client without the token is refused while one with it joins, and the token is a 0600
file outside $HOME that is never printed and goes when the submit ends."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import ray  # noqa: F401 - puts psutil, which comes with Ray, on the path
from test_faults import cli, finish, statuses, study_text, wait_for

from studyrunner.orchestrate.submission import _processes_of
from studyrunner.store import Ledger

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}

CLIENT = """\
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("JOINED", ray.cluster_resources().get("CPU"))
"""


def ray_processes(driver: int, session_dir: str) -> list:
    """The submit and every process it started (its Ray), with any process of its Ray session that left the tree."""
    import psutil

    root = psutil.Process(driver)
    found = {root.pid: root, **{p.pid: p for p in root.children(recursive=True)}}
    for pid in _processes_of(session_dir):
        found.setdefault(pid, psutil.Process(pid))
    return list(found.values())


def listening(processes) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket listening and every unconnected UDP socket."""
    import psutil

    found = []
    for proc in processes:
        try:
            name = proc.name()
            for conn in proc.net_connections(kind="inet"):
                udp = conn.type == socket.SOCK_DGRAM and not conn.raddr
                if conn.status == psutil.CONN_LISTEN or udp:
                    found.append((name, conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:  # a worker that ended meanwhile
            continue
    return found


def other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback: where a neighbour would knock."""
    import psutil

    return sorted(
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    )


def client(address: str, home: Path, **env: str) -> tuple[int, str]:
    """A Ray driver on this machine joining `address` (single-machine mode: it reaches 127.0.0.1 as given)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    base.update(HOME=str(home), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", **env)
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, address], env=base, capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_running_submit_listens_on_localhost_only_and_wants_its_token(tmp_path):
    home = tmp_path / "home"  # the user's home: nothing of Ray may be written there
    home.mkdir()
    study = tmp_path / "open.yaml"
    study.write_text(study_text("open", steps=200_000, seeds="[0]"))  # runs until the test stops it
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", "--max-concurrent", "1", workspace=ws, env={"HOME": str(home)})
    try:
        wait_for(lambda: "running" in statuses(ws, "open").values(), timeout=300, what="a trial to be running")
        (sub,) = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).live_submissions("open")
        assert sub.ray_session_dir

        processes = ray_processes(driver.pid, sub.ray_session_dir)
        sockets = listening(processes)
        names = {name for name, _, _ in sockets}
        assert {"gcs_server", "raylet"} <= names and len(sockets) >= 5, sockets  # the GCS, node and object managers...
        assert [s for s in sockets if s[1] not in LOOPBACK] == [], sockets
        for address in other_addresses():  # nothing answers on the machine's network addresses
            for _, _, port in sockets:
                with socket.socket() as probe, pytest.raises(OSError):
                    probe.settimeout(2)
                    probe.connect((address, port))

        raylet = next(p for p in processes if p.name() == "raylet")  # started with the submit's Ray settings
        environ = raylet.environ()
        assert environ.get("RAY_AUTH_MODE") == "token"
        token = Path(environ["RAY_AUTH_TOKEN_PATH"])
        info = token.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()
        assert home not in token.parents and not (home / ".ray").exists()
        secret = token.read_text().strip()
        assert len(secret) >= 32

        gcs = next(f"127.0.0.1:{port}" for name, _, port in sockets if name == "gcs_server")
        code, output = client(gcs, tmp_path / "stranger")  # no token: refused
        assert code != 0 and "JOINED" not in output, output
        assert "Unauthenticated" in output or "InvalidAuthToken" in output, output
        code, output = client(gcs, tmp_path / "stranger", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
        assert code != 0 and "JOINED" not in output, output  # a wrong token: refused
        code, output = client(gcs, tmp_path / "owner", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        assert code == 0 and "JOINED" in output, output  # the token is what it takes
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGINT)
        code, output = finish(driver, timeout=300)
    assert code == 130, output
    assert secret not in output
    assert not token.exists()  # gone with the submit
    assert not (home / ".ray").exists()


# What a second local user tries against a running submit: every path into the embedded Ray's folder, the token
# and the session folders (a shell script: another user may not be able to run this checkout's Python). Each line
# prints the outcome; "DENIED" is the only acceptable one.
INTRUDER = r"""
private=$1 token=$2 session=$3
attempt() { what=$1; shift; if "$@" >/dev/null 2>&1; then echo "$what DONE"; else echo "$what DENIED"; fi; }
attempt "list private" ls "$private"
attempt "create in private" touch "$private/planted"
attempt "create in ray" touch "$private/ray/planted"
attempt "create in session" touch "$session/planted"
attempt "create in sockets" touch "$session/sockets/planted"
attempt "read token" cat "$token"
attempt "replace token" mv -f /tmp/sr-intruder-token "$token"
attempt "delete token" rm -f "$token"
attempt "rename ray" mv "$private/ray" "$private/gone"
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/setpriv").exists(), reason="needs root and setpriv")
def test_another_local_user_can_touch_nothing_of_a_running_submits_ray(tmp_path):
    """As uid/gid 65534 (nobody), while a submit runs: nothing can be listed, created, replaced or deleted in the
    embedded Ray's folder, its session folders or the token, and the token cannot be read; after the submit the
    private folder is still 0700 (Ray makes the folders inside 0777; nobody can reach them)."""
    study = tmp_path / "guarded.yaml"
    study.write_text(study_text("guarded", steps=200_000, seeds="[0]"))
    ws = tmp_path / "ws"
    driver = cli("submit", str(study), "--no-progress", "--max-concurrent", "1", workspace=ws)
    try:
        wait_for(lambda: "running" in statuses(ws, "guarded").values(), timeout=300, what="a trial to be running")
        (sub,) = Ledger(f"sqlite:///{ws / 'ledger.db'}", create=False).live_submissions("guarded")
        raylet = next(p for p in ray_processes(driver.pid, sub.ray_session_dir) if p.name() == "raylet")
        token = Path(raylet.environ()["RAY_AUTH_TOKEN_PATH"])
        private = token.parent
        assert Path(sub.ray_session_dir).parent == private / "ray"
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        planted = Path("/tmp/sr-intruder-token")
        planted.write_text("1" * 64)
        planted.chmod(0o666)
        try:
            as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
            proc = subprocess.run(
                [*as_nobody, "sh", "-c", INTRUDER, "intruder", str(private), str(token), sub.ray_session_dir],
                capture_output=True,
                text=True,
                timeout=60,
                cwd="/",
            )
        finally:
            planted.unlink(missing_ok=True)
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 9 and all(line.endswith(" DENIED") for line in lines), proc.stdout + proc.stderr
        assert token.is_file() and len(token.read_text().strip()) == 64 and "planted" not in os.listdir(private)
    finally:
        if driver.poll() is None:
            driver.send_signal(signal.SIGINT)
        code, output = finish(driver, timeout=300)
    assert code == 130, output
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
