"""Every bench/*.py imports (a name moved in ratrain fails here, not when the docs' command is
next run), says its --help, and refuses bad arguments in one line rather than a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from .bench_loader import BENCH, load_bench

SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py"))


def _import(name: str):
    """bench/NAME.py as a module of its own name (registered: dataclasses look their module up)."""
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_import_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_bench_script_imports_and_a_script_says_its_help(name, monkeypatch, capsys):
    module = _import(name)
    if not hasattr(module, "main"):  # a module the scripts import
        return
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage:")


def _refused(monkeypatch, capsys, name: str, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])
    with pytest.raises(SystemExit) as done:
        load_bench(name).main()
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("name,args,needle", [
    ("scaling", ["--devices", "8,abc"], "--devices: comma-separated device counts, got '8,abc'"),
    ("scaling", ["--studies", "weak,wide"], "--studies: weak and/or strong"),
    ("scaling", ["--model", "nosuch", "--devices", "8"], "error: unknown model preset 'nosuch'"),
    ("scaling", ["--replot", "--out", "missing.json"], "--out missing.json does not exist"),
    ("head_loss", ["--rounds", "0"], "--rounds must be >= 1, got 0"),
    ("head_loss", ["--steps", "1"], "--steps must be >= 2"),
    ("host_grad_update", ["--rounds", "1"], "--rounds must be >= 2"),
    ("gpu_offload_peer", [], "required: spec"),
    ("tokenize_large", ["--src", "no/such/src"], "--src no/such/src has no ratrain/ package"),
])
def test_bad_arguments_are_refused_in_one_line(monkeypatch, capsys, tmp_path, name, args, needle):
    monkeypatch.chdir(tmp_path)
    assert needle in _refused(monkeypatch, capsys, name, *args)


def test_a_measurement_of_another_ratrain_or_none_is_a_failure(tmp_path):
    measured = load_bench("tokenize_large").measured
    src = tmp_path / "src"

    def done(code, out):
        return subprocess.CompletedProcess([], code, out, "Traceback ...\nImportError: x")

    here = f"{src}/ratrain/__init__.py\n1.0 s, peak RSS 0.5 GB, 9 tokens\n"
    assert measured(done(0, here), src) == "1.0 s, peak RSS 0.5 GB, 9 tokens"
    installed = "/site-packages/ratrain/__init__.py\n1.0 s, peak RSS 0.5 GB, 9 tokens\n"
    assert measured(done(0, installed), src).startswith(
        "failed: it imported /site-packages/ratrain/__init__.py, not the ratrain under")
    assert measured(done(1, ""), src).startswith("failed (exit 1)")
