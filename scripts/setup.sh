#!/usr/bin/env bash
# Create .venv with ratrain and its dependencies. torch 2.13.0 is pinned here (a CPU build that
# lies on this project's machines' disk); the package itself only asks for torch>=2.4, so GPU
# users keep their own build. Extra arguments are pip extras, e.g. `scripts/setup.sh test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
extras=${1:+[$1]}
.venv/bin/python -m pip install -q -e ".${extras}"
.venv/bin/python -c "import ratrain, torch; print('ratrain', ratrain.__version__, 'torch', torch.__version__)"
