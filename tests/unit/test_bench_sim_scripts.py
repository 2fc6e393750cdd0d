"""bench/sim_accuracy.py, bench/sim_breakdown.py and bench/profile_stability.py: what their
command lines refuse or accept before any run, and profile_stability's comparison of two
profiles that do not hold the same figures (no training runs, no measuring)."""

from __future__ import annotations

import sys

import pytest

from ratrain.sim.profile import from_dict, load_profile

from .bench_loader import load_bench

sim_accuracy = load_bench("sim_accuracy")
sim_breakdown = load_bench("sim_breakdown")
profile_stability = load_bench("profile_stability")


class Ran(Exception):
    """A run was started: the command line got past its checks."""


def _main(monkeypatch, capsys, module, *argv) -> tuple[int | str, str]:
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    with pytest.raises((SystemExit, Ran)) as got:
        module.main()
    code = got.value.code if isinstance(got.value, SystemExit) else "ran"
    return code, capsys.readouterr().err


def _no_runs(monkeypatch):
    def run(*args, **kwargs):
        raise Ran

    for module in (sim_accuracy, sim_breakdown.sa):
        monkeypatch.setattr(module, "_measure_config", run)
        monkeypatch.setattr(module, "_profile_repeat", run)


def test_too_few_steps_are_refused_before_any_run(monkeypatch, capsys, tmp_path):
    """The first two steps are not measured: --steps 2 trained every configuration, then
    failed at the end (no median of no steps)."""
    _no_runs(monkeypatch)
    out = str(tmp_path / "r.json")
    for module, flags in ((sim_accuracy, ("--profile", "cpu-local", "--only", "1x1 keep")),
                          (sim_breakdown, ("--profile", "cpu-local", "--only", "1x1 keep"))):
        for steps in ("1", "2"):
            code, err = _main(monkeypatch, capsys, module, *flags, "--steps", steps,
                              "--out", out)
            assert code == 2 and f"--steps {steps}: at least 3" in err
        assert _main(monkeypatch, capsys, module, *flags, "--steps", "3", "--out", out)[0] == "ran"


def test_sim_breakdown_takes_the_labels_of_every_set(monkeypatch, capsys, tmp_path):
    _no_runs(monkeypatch)
    for label in ("tiny 2x1 s64 mb1", "tiny-gqa 1x1 s384 mb2, 2 threads"):
        code, err = _main(monkeypatch, capsys, sim_breakdown, "--profile", "cpu-local",
                          "--only", label, "--out", str(tmp_path / "r.json"))
        assert code == "ran", err
    code, err = _main(monkeypatch, capsys, sim_breakdown, "--only", "no such label")
    assert code == 2 and "no configuration 'no such label'" in err


def _shape(seq_len: int, micro: int, forward: float) -> dict:
    times = {"forward_s": forward, "backward_s": 2 * forward}
    return {"model": "tiny", "seq_len": seq_len, "micro_batch_size": micro, "dtype": "float32",
            "embedding": times, "block": times, "head": times}


def _measured(tmp_path, name: str, contention: float, unstable=None, attention=0.2,
              measured=True):
    data = load_profile("cpu-local").to_dict()
    data["name"] = name
    data["device"]["contention"] = contention
    data["device"]["compute"]["float32"]["attention_efficiency"] = attention
    data["measured"] = [_shape(256, 2, 0.01), _shape(128, 1, 0.003)] if measured else []
    data["unstable"] = unstable or {}
    path = tmp_path / f"{name}.yaml"
    from_dict(data, name).save(path)
    return path


def test_figures_one_profile_lacks_are_listed_apart_and_unstable_edges_mark_a_figure(tmp_path):
    edges = {"slow": {"device.contention": 0.5}, "fast": {"device.contention": 0.0}}
    a = _measured(tmp_path, "a", 0.1, unstable=edges)
    b = _measured(tmp_path, "b", 0.4, attention=None)
    rows, missing = profile_stability.compare([a, b])
    by_figure = {r["figure"]: r for r in rows}
    assert missing == {"device.compute.float32.attention_achieved": [2]}
    contention = by_figure["device.contention"]
    assert contention["spread"] > 0.1 and contention["marked_unstable"] and contention["passes"]
    assert not by_figure["device.memory_bandwidth"]["marked_unstable"]
    # the shape of every measured entry is no figure, its times are
    assert not any(f.endswith(("seq_len", "micro_batch_size")) for f in by_figure)
    assert "measured[1].block.forward_s" in by_figure
    rows, missing = profile_stability.compare([a, _measured(tmp_path, "c", 0.1, measured=False)])
    assert missing["measured[1].block.forward_s"] == [2] and rows


def test_a_file_that_is_no_profile_is_said_in_one_line(monkeypatch, capsys, tmp_path):
    a = _measured(tmp_path, "a", 0.1)
    code, _ = _main(monkeypatch, capsys, profile_stability, "--profiles", str(a),
                    str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "r.json"))
    assert isinstance(code, str) and "missing.yaml" in code and len(code.splitlines()) == 1
    assert not (tmp_path / "r.json").exists()
