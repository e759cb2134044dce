"""Where the embedded defaults live, and how each part is pointed elsewhere.

One folder per project (default `./.studyrunner`, or `$STUDYRUNNER_HOME`) holds:

    ledger.db      results ledger (SQLite)            --db / $STUDYRUNNER_DB
    mlflow.db      MLflow tracking store (SQLite)     --tracking-uri / $MLFLOW_TRACKING_URI
    mlartifacts/   MLflow artifacts, one folder per study
    curves/        per-step Parquet curves            --storage / $STUDYRUNNER_STORAGE
    ray/           Ray Tune experiment folders
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workspace:
    root: Path
    db_url: str
    tracking_uri: str
    storage: str  # a local folder or a pyarrow filesystem URI (s3://..., gs://...)

    @classmethod
    def resolve(
        cls,
        root: str | Path | None = None,
        db: str | None = None,
        tracking_uri: str | None = None,
        storage: str | None = None,
    ) -> Workspace:
        home = Path(root or os.environ.get("STUDYRUNNER_HOME") or ".studyrunner").expanduser().resolve()
        return cls(
            root=home,
            db_url=db or os.environ.get("STUDYRUNNER_DB") or f"sqlite:///{home / 'ledger.db'}",
            tracking_uri=tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}",
            storage=storage or os.environ.get("STUDYRUNNER_STORAGE") or str(home),
        )

    @property
    def is_local_storage(self) -> bool:
        return "://" not in self.storage or self.storage.startswith("file://")

    def ensure(self) -> Workspace:
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    def artifact_location(self, study: str) -> str:
        if self.is_local_storage:
            return (Path(self.storage.removeprefix("file://")) / "mlartifacts" / study).resolve().as_uri()
        return f"{self.storage.rstrip('/')}/mlartifacts/{study}"

    def ray_storage(self) -> str:
        if self.is_local_storage:
            return str(Path(self.storage.removeprefix("file://")) / "ray")
        return f"{self.storage.rstrip('/')}/ray"
