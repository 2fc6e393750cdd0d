#!/usr/bin/env bash
# Install ratrain with its test dependencies into .venv, then run the whole test suite: two
# pytest-xdist workers, a test file to each in turn (a file's module fixtures are made once),
# so that one file's processes waiting on each other leave the other core to the next file; the
# files that take minutes first (tests/conftest.py's STARTED_FIRST, in collection order).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
