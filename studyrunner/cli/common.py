"""What every verb shares: the Typer app, the consoles, the common options, the error boundary (one line and a
non-zero exit, never a traceback) and the workspace and ledger a verb opens."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from ..errors import StudyrunnerError
from ..urls import mask_text, mask_url

app = typer.Typer(
    name="studyrunner",
    help="Declarative ablation and scaling studies of looped transformers (Ray Tune + MLflow + SQL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: rich markup would swallow "[env STUDYRUNNER_DB; default: ...]" as a tag.
    rich_markup_mode=None,
)
# Piped output (CI logs, `| less`) gets room for wide tables instead of rich's 80-column fallback.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 200)

StudyFile = Annotated[Path, typer.Argument(help="Study file (YAML).", show_default=False)]
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db", help="SQLAlchemy URL of the results ledger [env STUDYRUNNER_DB; default: SQLite in the workspace]."
    ),
]
WorkspaceOpt = Annotated[
    Path | None, typer.Option("--workspace", help="Workspace folder [env STUDYRUNNER_HOME; default ./.studyrunner].")
]
TrackingOpt = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri", help="MLflow tracking URI [env MLFLOW_TRACKING_URI; default: SQLite in the workspace]."
    ),
]


# The locations the command was given (its workspace's URLs): their passwords are masked in every error,
# warning and footer line, whatever quotes them (a driver's message, a path built from a URL).
locations: list[str] = []


def shown(text: str) -> str:
    """`text` as it may be printed: no password of a URL in it, nor of the command's locations."""
    return mask_text(text, *locations)


def say_error(message: str) -> None:
    """One line on stderr; the message (file names, user text, schema patterns) prints literally."""
    err.print(Text.assemble(("error: ", "red"), shown(str(message))), highlight=False, soft_wrap=True)


def user_errors(fn):
    """The CLI's error boundary: every failure ends in one line and a non-zero exit, never a traceback.

    A StudyrunnerError is the user's to mend (its code: 2 for a study file, 1 otherwise). Anything else
    is a bug or an environment problem: one line naming it, exit 1, and STUDYRUNNER_DEBUG=1 shows the
    traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        footer.clear()
        locations.clear()
        try:
            value = fn(*args, **kwargs)
            print_footer()
            return value
        except typer.Exit:
            print_footer()  # a verdict (verify's exit 1), not an error
            raise
        except StudyrunnerError as exc:
            say_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Abort, typer.BadParameter, KeyboardInterrupt, SystemExit):
            raise  # click's own usage errors (a bad option value) print as usual, exit 2
        except Exception as exc:  # noqa: BLE001 - the boundary itself
            if os.environ.get("STUDYRUNNER_DEBUG"):
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            say_error(f"{type(exc).__name__}: {first} (unexpected; STUDYRUNNER_DEBUG=1 shows the traceback)")
            raise typer.Exit(1) from None

    return wrapper


# Lines printed once a command has done its work (which ledger a read verb read), so that an error stays one line.
footer: list[str] = []


def print_footer() -> None:
    for line in dict.fromkeys(footer):
        err.print(shown(line), markup=False, highlight=False, soft_wrap=True)
    footer.clear()


def warn(lines: list[str]) -> None:
    for line in lines:
        err.print(Text.assemble(("warning: ", "yellow"), shown(line)), highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        out.print(f"studyrunner {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
):
    """Declarative ablation and scaling studies of looped transformers (Ray Tune + MLflow + SQL)."""


def open_workspace(
    workspace: Path | None, db: str | None = None, tracking_uri: str | None = None, storage: str | None = None
):
    from ..workspace import Workspace

    locations.extend(value for value in (db, tracking_uri, storage) if value)  # shown masked if resolve fails
    ws = Workspace.resolve(workspace, db=db, tracking_uri=tracking_uri, storage=storage)
    locations.extend((ws.db_url, ws.tracking_uri, ws.storage))
    for line in ws.ignored_env:
        err.print(Text.assemble(("note: ", "cyan"), shown(line)), highlight=False, soft_wrap=True)
    return ws


def read_ledger(ws):
    """The ledger of `ws` for a read verb: opened without writing anything, and said which it is read from
    (on stderr, so a verb's output on stdout stays clean)."""
    from ..store import Ledger

    ledger = Ledger(ws.db_url, create=False, read_only=True)
    footer.append(f"read from ledger {mask_url(ws.db_url)}")
    if ledger.read_note:
        err.print(Text.assemble(("note: ", "cyan"), ledger.read_note), highlight=False, soft_wrap=True)
    return ledger


AddressOpt = Annotated[
    str | None, typer.Option(help="Ray cluster address [env RAY_ADDRESS; default: start a local Ray].")
]
MaxConcurrentOpt = Annotated[int | None, typer.Option(min=1, help="At most this many trials at once.")]
MaxFailuresOpt = Annotated[
    int | None,
    typer.Option(min=0, help="Retries per trial after infrastructure failures [default: the study's `retries:`]."),
]
StorageOpt = Annotated[
    str | None, typer.Option(help="Folder or URI for curves, checkpoints and Ray results [env STUDYRUNNER_STORAGE].")
]
ProgressOpt = Annotated[bool, typer.Option(help="Live progress display.")]
StaleOpt = Annotated[
    float | None,
    typer.Option(
        min=0,
        help="Seconds without a heartbeat before a submit counts as dead [env STUDYRUNNER_STALE_AFTER; 60].",
    ),
]
StudyName = Annotated[str, typer.Argument(help="Study name (as in the ledger).", show_default=False)]


def run_options(address=None, max_concurrent=None, max_failures=None, progress=True, stale_after=None):
    """The options of a command that trains, after its settings (environment variables) are checked."""
    from .. import settings
    from ..orchestrate import RunOptions
    from ..store.ledger import STALE_AFTER_S

    settings.check()
    return RunOptions(
        address=address,
        max_concurrent=max_concurrent,
        max_failures=max_failures,
        show_progress=progress,
        stale_after=STALE_AFTER_S if stale_after is None else stale_after,
    )
