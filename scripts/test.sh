#!/usr/bin/env bash
# Install ratrain with its test dependencies into .venv, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
