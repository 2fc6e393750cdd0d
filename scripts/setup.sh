#!/usr/bin/env bash
# Create .venv with ratrain and its dependencies. torch 2.13.0 is pinned here (a CPU build that
# lies on this project's machines' disk); the package itself only asks for torch>=2.4, so GPU
# users keep their own build. Extra arguments are pip extras, e.g. `scripts/setup.sh test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# pip compiles every module it installs on one core (torch alone: 25 of its 35 s); compileall
# does the same on every core afterwards. Like pip, it goes past files written for a newer
# Python (torch/testing/_internal/py312_intrinsics.py), which it reports and exits 1 for.
.venv/bin/python -m pip install -q --no-compile "torch==2.13.0"
extras=${1:+[$1]}
.venv/bin/python -m pip install -q --no-compile -e ".${extras}"
.venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages > /dev/null || true
.venv/bin/python -c "import ratrain, torch; print('ratrain', ratrain.__version__, 'torch', torch.__version__)"
