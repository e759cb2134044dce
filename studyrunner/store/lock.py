"""One command at a time creates (or migrates) the local SQLite stores: the ledger and MLflow's store.

Unguarded, two `submit`s into a brand-new workspace would race through the same CREATE TABLEs and MLflow's
migrations and could leave a half-made `mlflow.db` (a `_alembic_tmp_*` table, a schema between two revisions) that
every later command then fails on. So the command that opens the stores holds an exclusive `flock` on a file beside
them, `.studyrunner-stores.lock` (in the workspace by default), while it creates or migrates them; a second
command waits for it (seconds), then finds them made. The kernel releases the lock when its holder exits,
`kill -9` included, so a lock is never left behind. A store on a server (PostgreSQL) is not locked here: its
DDL is transactional, and the loser of a race finds the winner's tables.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from ..errors import StudyrunnerError

LOCK_NAME = ".studyrunner-stores.lock"
# Creating both stores takes seconds; a holder still busy after this long is stuck (a hung file system).
WAIT_S = 600.0


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL (`sqlite:///path`, relative to the current folder), or None."""
    if not url.startswith("sqlite:///"):
        return None
    return Path(url.removeprefix("sqlite:///").split("?", 1)[0]).expanduser().resolve()


@contextmanager
def stores_lock(*urls: str, on_wait: Callable[[str], None] | None = None, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the lock of every folder that holds one of the SQLite stores of `urls` (sorted, so two commands
    take them in the same order) for the `with` block. `on_wait` hears one line when another command holds one.
    A folder where no lock file can be made (a read-only location) is not locked: nothing is created there."""
    folders = sorted({path.parent for path in filter(None, map(sqlite_file, urls))})
    with ExitStack() as stack:
        for folder in folders:
            stack.enter_context(_locked(folder / LOCK_NAME, on_wait, wait_s))
        yield


@contextmanager
def _locked(path: Path, on_wait: Callable[[str], None] | None, wait_s: float) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        fd = None  # read-only: the store's own open says what is wrong
    try:
        if fd is not None:
            _acquire(fd, path, on_wait, wait_s)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _acquire(fd: int, path: Path, on_wait: Callable[[str], None] | None, wait_s: float) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    if on_wait is not None:
        on_wait(f"waiting for another studyrunner command to finish creating the stores in {path.parent}")
    deadline = time.monotonic() + wait_s
    while True:
        time.sleep(0.05)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StudyrunnerError(
                    f"another studyrunner command has been creating the stores in {path.parent} for {wait_s:.0f} s "
                    f"(it holds {path}); let it finish, or stop it, then run this command again"
                ) from None
