#!/usr/bin/env bash
# The prepared GPU run (the brief's standing rule: first thing in a session that is lent a GPU).
#
#   here, once:  bash benchmarks/gpu_suite.sh fetch
#                (the wheels a bare GPU machine lacks, into .whl/, which .git/info/exclude ignores)
#   there:       the device tool's run with command "bash benchmarks/gpu_suite.sh", carry [".whl"],
#                timeout_s 540 (the suite plans for about 8 minutes)
#
# There it installs the wheels into /tmp/site (no index, no deps: they are pinned to this repo's versions),
# then runs benchmarks/gpu_suite.py with its JSON and the first look's rows under $OUT. Commit the JSON as
# benchmarks/results/<date>-<device>-gpu_suite.json and the figures into docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "fetch" ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    py=".venv/bin/python"
    versions=$("$py" - <<'EOF'
import importlib.metadata as m
names = ["pydantic", "pydantic-core", "annotated-types", "typing-extensions", "typing-inspection", "pyyaml"]
print(" ".join(f"{n}=={m.version(n)}" for n in names))
EOF
)
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $versions
    ls .whl
    exit 0
fi

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/gpu_suite.py --out "${OUT:-.}/gpu_suite.json" 2>&1 | tee "${OUT:-.}/gpu_suite.log"
