"""The Ray a command runs on: an embedded one this process starts, or the cluster the user names.

The embedded Ray (no --address, no RAY_ADDRESS) is this machine's alone. Every process of it listens on
127.0.0.1 only (GCS, raylet with its object and node managers, workers, the dashboard, metrics and
runtime-env agents), and it uses Ray's token authentication (RAY_AUTH_MODE=token), so a client without
the token cannot connect, from this machine either. The token is random, one per process, in a 0600 file
(never under $HOME, never printed), removed when the process exits.

Other users of the machine can reach none of it. Ray makes every folder it creates world-writable (its
`try_make_directory_shared` chmods the temp folder, each session folder and their sockets/ and logs/ to
0777), so Ray's folder is not the private one: it is `ray/` inside `sr-ray-UID` in the system temp folder,
which is this user's, 0700, and which Ray never touches. The token lies beside `ray/`, in that 0700 folder,
so another user can neither read, replace nor delete it, nor create anything in Ray's session folders.

Ray 2.60 has no "local only" switch: its processes listen on the node's address, which `ray.init`
resolves to the machine's external one unless Ray runs in its single-machine mode (the mode it uses on
macOS and Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0), where the node is 127.0.0.1. That mode is on
while the embedded Ray starts (its processes inherit it), and the node's address is checked afterwards:
anything but 127.0.0.1 stops it, with an error.

A cluster keeps the user's own Ray settings: its authentication (RAY_AUTH_MODE, RAY_AUTH_TOKEN,
RAY_AUTH_TOKEN_PATH as they were before this process started an embedded Ray, if it did) and addresses.
Opening a Ray to a network is done that way, on purpose: `ray start --head` with the settings you choose,
then `--address` (docs/guide/clusters.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...errors import StudyrunnerError
from ..signals import sigterm_handler_kept
from .warm_workers import system_config

LOOPBACK = "127.0.0.1"
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
SINGLE_MACHINE_VARIABLE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
TOKEN_PREFIX = "auth-token-"

_users_auth: dict[str, str | None] | None = None  # the user's Ray authentication settings, once we changed them
_token: Path | None = None  # this process's token file
_embedded = False  # this process started the Ray it is connected to


def quiet_ray_env() -> None:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", "auto")
    # Tune's own result files (result.json, progress.csv, TensorBoard events per trial) would repeat what the
    # ledger, the Parquet curves and MLflow hold, written by the driver for every report.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Tune's end-of-run advice (Tuner.restore, missing result files of unstarted trials) is not how a
    # study resumes: resubmitting the study file is. The CLI says so itself.
    for name in ("ray.tune.tune", "ray.tune.analysis.experiment_analysis"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # A failed trial is shown as one line by the progress display; its full traceback is in the ledger
    # and MLflow, not repeated ~30 lines deep on the console for every attempt.
    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # "Processing trial results took 1.4 s": the driver's first MLflow writes, not a user's concern.
    logging.getLogger("ray.tune.utils.util").setLevel(logging.ERROR)
    # A resumed attempt's replay report (a list of records) is not a value TensorBoard can log; the curve has it.
    logging.getLogger("ray.tune.logger.tensorboardx").setLevel(logging.ERROR)


def ensure_ray(address: str | None = None, num_cpus: int | None = None) -> bool:
    """Start the embedded Ray (or join `address` / $RAY_ADDRESS). True if this call started or joined it."""
    import ray
    from ray._private import ray_constants

    global _embedded
    quiet_ray_env()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    # Not in the driver: Ray's C++ failure handler takes SIGTERM over (it aborts, exit 134, leaving Ray's agents
    # running); the command's own handler stops the study as Ctrl-C does (orchestrate/signals.py). Workers keep theirs.
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    kwargs: dict = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    try:
        with sigterm_handler_kept():
            if address and address != "local":  # Ray's "local": start a new one, which is the embedded one
                _join(address, kwargs)
            else:
                _embedded = True
                _start_embedded(num_cpus, kwargs)
    except BaseException:
        ray.shutdown()  # a half-started Ray leaves no processes behind
        _embedded = False
        raise
    return True


def started_here() -> bool:
    """Whether this process started the Ray it is connected to (the embedded one), and so must stop it."""
    import ray

    return _embedded and ray.is_initialized()


def stop_ray() -> None:
    """Shut down the Ray this process is connected to; the embedded one stops with it."""
    import ray

    global _embedded
    ray.shutdown()
    _embedded = False


def _join(address: str, kwargs: dict) -> None:
    import ray

    _restore_users_auth()
    _check_reachable(address)
    try:
        ray.init(address=address, **kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray raises several types for an unreachable cluster
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StudyrunnerError(
            f"cannot join the Ray cluster at {address!r}: {first} (check --address / RAY_ADDRESS)"
        ) from None


def _start_embedded(num_cpus: int | None, kwargs: dict) -> None:
    import ray

    private = private_temp_dir()
    _use_token(_token_file(private))
    with _single_machine_mode():
        ray.init(num_cpus=num_cpus, _temp_dir=str(ray_temp_dir(private)), _system_config=system_config(), **kwargs)
    node = ray.util.get_node_ip_address()
    if node != LOOPBACK:
        raise StudyrunnerError(
            f"the embedded Ray would listen on {node}, not {LOOPBACK} (this Ray version resolves the node's "
            "address differently); stopped it. Start a Ray cluster yourself and pass --address"
        )


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable head for minutes; a TCP probe says so in two seconds."""
    if address == "auto" or ":" not in address:
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, ValueError) as exc:
        raise StudyrunnerError(
            f"cannot reach the Ray cluster at {address!r}: {exc} (check --address / RAY_ADDRESS)"
        ) from None


# ------------------------------------------------------------------------------ the embedded Ray's parts


def private_temp_dir() -> Path:
    """This user's private folder for the embedded Ray, 0700: short (Unix socket paths are limited to 107
    characters) and this user's alone. It holds the token file and Ray's own folder (`ray_temp_dir`)."""
    path = Path(tempfile.gettempdir()) / f"sr-ray-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise StudyrunnerError(
            f"{path} (the embedded Ray's temp folder) is not a folder of yours; remove it, or set TMPDIR to "
            "a folder only you can write to"
        )
    if info.st_mode & 0o077:  # an older studyrunner let Ray widen it: close it before anything goes in
        path.chmod(0o700)
    return path


def ray_temp_dir(private: Path) -> Path:
    """Ray's temp folder: `ray/` in the private folder. Ray makes it and its session folders 0777; the 0700
    folder around it keeps other users out, whatever Ray does inside. An entry of that name that is not a
    folder of this user's (a link planted while an older studyrunner left the private folder open) is refused."""
    path = private / "ray"
    path.mkdir(exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise StudyrunnerError(
            f"{path} (the embedded Ray's own folder) is not a folder of yours; remove it and submit again"
        )
    return path


def _token_file(folder: Path) -> Path:
    """This process's token: random, in a file only this user can read; it goes when the process does."""
    global _token
    if _token is not None and _token.is_file():
        return _token
    for old in folder.glob(f"{TOKEN_PREFIX}*"):  # left by processes that were killed
        pid = old.name.removeprefix(TOKEN_PREFIX)
        if pid.isdigit() and not _alive(int(pid)):
            old.unlink(missing_ok=True)
    path = folder / f"{TOKEN_PREFIX}{os.getpid()}"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    atexit.register(_remove_token, path, os.getpid())
    _token = path
    return path


def _remove_token(path: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child
        path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _use_token(path: Path) -> None:
    """RAY_AUTH_MODE=token with this token file, for this process and the Ray processes it starts."""
    global _users_auth
    if _users_auth is None:
        _users_auth = {name: os.environ.get(name) for name in AUTH_VARIABLES}
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(path))
    _reload_auth()


def _restore_users_auth() -> None:
    global _users_auth
    if _users_auth is None:
        return
    for name, value in _users_auth.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _users_auth = None
    _reload_auth()


def _reload_auth() -> None:
    """Ray caches the authentication mode (RayConfig) and the token in C++; both are read again from the
    environment here, as Ray's own `_enable_token_auth` does."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


@contextmanager
def _single_machine_mode() -> Iterator[None]:
    """Ray's single-machine mode while the embedded Ray starts: its node is 127.0.0.1. Ray reads the
    variable when it is imported (ray_constants), so the constant is set too; both are put back after."""
    from ray._private import ray_constants

    before = os.environ.get(SINGLE_MACHINE_VARIABLE), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE_VARIABLE] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if before[0] is None:
            os.environ.pop(SINGLE_MACHINE_VARIABLE, None)
        else:
            os.environ[SINGLE_MACHINE_VARIABLE] = before[0]
        ray_constants.ENABLE_RAY_CLUSTER = before[1]


def ray_session_dir() -> str | None:
    """The session folder of the Ray this process started, which the ledger keeps so that `reap_dead` can stop
    the Ray a killed driver left behind (orchestrate/submission.py)."""
    try:
        import ray._private.worker as worker

        return worker.global_worker.node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - a private API; without it a crash leaves Ray to the user
        return None
