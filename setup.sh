#!/usr/bin/env bash
# Creates .venv and installs studyrunner with everything it needs (runtime + test tools, with the
# linters of docker/: hadolint and shellcheck, from the `dev` extra).
#
#   ./setup.sh                      # CPU machine: torch==2.13.0 (the CPU build where one is on disk)
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 ./setup.sh   # pick a CUDA build
#   TORCH_SPEC="torch==2.13.0" EXTRAS="dev,postgres" ./setup.sh
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-dev}

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { echo "setup.sh: studyrunner needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

# torch first and pinned: an unpinned torch makes pip fetch a multi-GB CUDA build on CPU-only machines.
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  pip install "$TORCH_SPEC" --index-url "$TORCH_INDEX_URL"
else
  pip install "$TORCH_SPEC"
fi
pip install -e ".[${EXTRAS}]"
.venv/bin/python -c 'import torch, ray, mlflow, studyrunner; print(
  f"studyrunner {studyrunner.__version__}: torch {torch.__version__} (cuda: {torch.cuda.is_available()}), "
  f"ray {ray.__version__}, mlflow {mlflow.__version__}")'
echo "ready: .venv/bin/studyrunner --help"
