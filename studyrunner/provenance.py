"""Where a result came from: the code version and the machine that computed it.

Stdlib only (no torch, ray or mlflow import), so it answers on a bare machine and costs nothing to
import; versions come from installed package metadata. Values are strings, ready for MLflow params.
"""

from __future__ import annotations

import functools
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

GIT_TIMEOUT_S = 3.0  # a status over a huge or network-mounted tree must not hold up a trial
PACKAGES = ("torch", "ray", "mlflow")
_SOURCE = Path(__file__).resolve().parent  # the studyrunner package folder


def provenance() -> dict[str, str]:
    """git_sha, git_dirty ("true"/"false"), studyrunner/torch/ray/mlflow versions, python, host.

    git_sha and git_dirty are "unknown" when the package is not a tracked part of a git checkout
    (an installed wheel) or git is missing or slow; a package that is not installed is "absent".
    git_dirty looks at the package's own files (tracked changes and untracked files), not the rest
    of the checkout. Cached per process: it describes the code this process imported."""
    return dict(_cached())


@functools.cache
def _cached() -> tuple[tuple[str, str], ...]:
    sha, dirty = _git_state()
    values = {
        "git_sha": sha,
        "git_dirty": dirty,
        "studyrunner_version": _version("studyrunner", fallback=_own_version()),
        **{f"{name}_version": _version(name) for name in PACKAGES},
        "python_version": platform.python_version(),
        "host": socket.gethostname(),
    }
    return tuple(values.items())


def _version(package: str, fallback: str = "absent") -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return fallback


def _own_version() -> str:
    from . import __version__

    return __version__


def _git(*args: str) -> str | None:
    """git's stdout run in the package folder, or None (no git, not a checkout, too slow)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=_SOURCE, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_state() -> tuple[str, str]:
    # A package installed into a venv inside some other checkout is not that checkout's code: require
    # that the package itself is tracked there.
    if _git("ls-files", "--error-unmatch", "__init__.py") is None:
        return "unknown", "unknown"
    sha = (_git("rev-parse", "HEAD") or "").strip()
    if not sha:
        return "unknown", "unknown"
    status = _git("status", "--porcelain", "--", ".")
    return sha, "unknown" if status is None else str(bool(status.strip())).lower()
