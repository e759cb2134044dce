"""`studyrunner ui`: an MLflow server whose lifetime is the command's.

The server runs in its own process group (so the terminal's Ctrl-C reaches only us, and we stop it in
order, without its shutdown tracebacks) and is asked to die with us (Linux PR_SET_PDEATHSIG), so even a
`kill -9` of `ui` does not leave a server answering. A port that cannot be bound is an error, not a URL
printed over someone else's server.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..errors import StudyrunnerError

READY_TIMEOUT_S = 300  # a fresh server took 60 s to answer on a loaded 2-core machine


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: Ctrl-C and SIGTERM still stop the server; kill -9 of `ui` may not


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise StudyrunnerError(
                f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                "is another server running there? choose another --port"
            ) from None


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def serve(tracking_uri: str, host: str, port: int, log_path: Path, on_ready) -> int:
    """Run the server until it exits or we are stopped (Ctrl-C, SIGTERM); returns an exit code."""
    check_port_free(host, port)
    # The store's URL goes in the environment, not on the command line, where any user of the machine could
    # read its password (`ps`).
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_BACKEND_STORE_URI": tracking_uri}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    stopping = False

    def stop_on(signum, _frame):
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop_on) for s in (signal.SIGTERM, signal.SIGHUP)}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent
        )
        try:
            url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not _answers(url + "/health"):
                if proc.poll() is not None:
                    raise StudyrunnerError(
                        f"the MLflow server exited with code {proc.returncode} before serving: "
                        f"{_tail(log_path) or 'no output'} (full log: {log_path})"
                    )
                if time.monotonic() > deadline:
                    raise StudyrunnerError(
                        f"the MLflow server did not answer within {READY_TIMEOUT_S} s; see {log_path}"
                    )
                time.sleep(0.3)
            on_ready(f"http://{host}:{port}")
            code = proc.wait()
            if code != 0 and not stopping:
                raise StudyrunnerError(f"the MLflow server stopped with code {code}: {_tail(log_path)} ({log_path})")
            return 0
        except KeyboardInterrupt:
            return 0
        finally:
            _stop(proc)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
