"""The layers of docs/architecture.md, held against the code: each package imports only the
packages below it, and the pure ones import neither torch nor anything that starts a process."""

from __future__ import annotations

import ast
from pathlib import Path

import ratrain

SRC = Path(ratrain.__file__).parent

MAY_IMPORT = {
    "errors": set(),
    "plain_data": set(),
    "host_memory": set(),
    "host_cores": set(),
    "cpu_features": set(),
    "byte_units": set(),
    "counts": set(),
    "file_modes": set(),
    "schedule": {"errors", "counts"},
    "checkpoint": {"errors", "counts", "host_memory", "file_modes"},
    "model_config": {"errors"},
    "field_errors": {"errors", "model_config"},
    "parallel_config": {"errors", "schedule", "field_errors"},
    "config": {"errors", "counts", "plain_data", "model_config", "field_errors", "parallel_config"},
    "models": {"errors", "counts", "config", "file_modes"},
    "data": {"errors", "counts", "config"},
    "sim": {"errors", "byte_units", "counts", "plain_data", "schedule", "config", "models"},
    "runtime": {"errors", "counts", "schedule", "config", "models"},
    "setup": {"errors", "counts", "byte_units", "schedule", "config", "models", "sim"},
    "planner": {"errors", "byte_units", "counts", "schedule", "config", "models", "sim", "setup"},
    "training": {"errors", "byte_units", "counts", "schedule", "checkpoint", "config", "models", "data", "sim", "runtime",
                 "setup", "host_memory", "host_cores", "cpu_features"},
    "profiling": {"errors", "byte_units", "counts", "schedule", "config", "models", "sim", "runtime", "training",
                  "host_memory", "host_cores"},
    "report": {"errors", "counts", "byte_units", "schedule", "config", "models", "sim", "runtime", "training", "setup"},
    "cli": {"errors", "byte_units", "counts", "schedule", "checkpoint", "config", "models", "data", "sim", "runtime",
            "setup", "planner", "training", "profiling", "report", "host_memory", "cpu_features"},
}
"""What each package (or top-level module) may import of ratrain, besides itself."""

PURE = ("schedule", "model_config", "counts", "field_errors", "parallel_config", "config", "sim",
        "setup", "planner")
"""Pure Python: no torch, no processes (the planner searches without them)."""


def _package(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            if node.module == "ratrain":
                names |= {f"ratrain.{alias.name}" for alias in node.names}
    return names


def _files():
    return [p for p in SRC.rglob("*.py") if p.parent != SRC or p.name != "__init__.py"]


def test_every_package_has_a_place_in_the_layers():
    assert {_package(p) for p in _files()} == set(MAY_IMPORT)


def test_each_package_imports_only_what_lies_below_it():
    wrong = []
    for path in _files():
        own = _package(path)
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "ratrain" and len(parts) > 1:
                other = parts[1]
                if other != own and other not in MAY_IMPORT[own]:
                    wrong.append(f"{path.relative_to(SRC)} imports ratrain.{other}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_pure_packages_import_no_torch():
    found = [f"{path.relative_to(SRC)} imports {name}" for path in _files()
             if _package(path) in PURE for name in _imports(path)
             if name.split(".")[0] in ("torch", "multiprocessing", "subprocess")]
    assert not found, "\n".join(found)
