"""Per-step curves as Parquet, one file per trial, on a local folder or any pyarrow filesystem."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


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
        tmp = path + ".tmp"
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp, filesystem=self.fs)
        self.fs.move(tmp, path)
        return path

    def read(self, study: str, trial_key: str) -> pd.DataFrame:
        return pq.read_table(self.path(study, trial_key), filesystem=self.fs).to_pandas()

    def read_study(self, study: str) -> pd.DataFrame:
        """Every curve of a study in one long frame (missing metrics are NaN)."""
        selector = pafs.FileSelector(f"{self.root}/{study}", allow_not_found=True)
        files = sorted(f.path for f in self.fs.get_file_info(selector) if f.path.endswith(".parquet"))
        if not files:
            return pd.DataFrame(columns=["trial_key", "step"])
        return pd.concat([pq.read_table(f, filesystem=self.fs).to_pandas() for f in files], ignore_index=True)
