"""Per-step curves as Parquet, one file per trial, on a local folder or any pyarrow filesystem.

A curve that cannot be read (truncated, overwritten, not Parquet) is `CurveUnreadable`, naming the file:
readers (`read_study`) leave it out and say so; the driver sets it aside (`set_aside`) and writes the
curve again from the records it holds and the ones a resumed attempt replays from its checkpoint.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..errors import StudyrunnerError


class CurveUnreadable(StudyrunnerError):
    """A curve file exists but is not a readable Parquet curve."""


class CurveStore:
    def __init__(self, storage: str):
        if "://" in storage and not storage.startswith("file://"):
            self.fs, root = pafs.FileSystem.from_uri(storage)
        else:
            self.fs, root = pafs.LocalFileSystem(), str(Path(storage.removeprefix("file://")).resolve())
        self.root = f"{root.rstrip('/')}/curves"

    def path(self, study: str, trial_key: str) -> str:
        return f"{self.root}/{study}/{trial_key}.parquet"

    def write(self, study: str, trial_key: str, rows: list[dict]) -> str:
        """Write one trial's rows (step + metrics; rows may carry different metrics) atomically."""
        frame = pd.DataFrame(rows).sort_values("step", kind="stable") if rows else pd.DataFrame({"step": []})
        frame.insert(0, "trial_key", trial_key)
        path = self.path(study, trial_key)
        self.fs.create_dir(f"{self.root}/{study}", recursive=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"  # its own name: two writers (two audits of one trial) never share one
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp, filesystem=self.fs)
        self.fs.move(tmp, path)
        return path

    def read(self, study: str, trial_key: str) -> pd.DataFrame:
        """The trial's curve; FileNotFoundError when it has none, CurveUnreadable when it cannot be read."""
        return self._read_file(self.path(study, trial_key))

    def _read_file(self, path: str) -> pd.DataFrame:
        try:
            return pq.read_table(path, filesystem=self.fs).to_pandas()
        except FileNotFoundError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CurveUnreadable(f"curve {path} is unreadable ({type(exc).__name__}: {first})") from None

    def read_study(self, study: str, warn: Callable[[str], None] | None = None) -> pd.DataFrame:
        """Every curve of a study in one long frame (missing metrics are NaN). An unreadable curve is left
        out and `warn` told so, one line naming the file (without `warn`: CurveUnreadable is raised)."""
        selector = pafs.FileSelector(f"{self.root}/{study}", allow_not_found=True)
        files = sorted(f.path for f in self.fs.get_file_info(selector) if f.path.endswith(".parquet"))
        frames = []
        for path in files:
            try:
                frames.append(self._read_file(path))
            except CurveUnreadable as exc:
                if warn is None:
                    raise
                warn(f"{exc}; left out of this analysis")
        if not frames:
            return pd.DataFrame(columns=["trial_key", "step"])
        return pd.concat(frames, ignore_index=True)

    def set_aside(self, study: str, trial_key: str) -> str:
        """Move an unreadable curve out of the way (kept, never deleted); returns where it went."""
        path = self.path(study, trial_key)
        aside = f"{path}.unreadable-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        self.fs.move(path, aside)
        return aside
