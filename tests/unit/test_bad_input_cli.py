"""Bad input to `ratrain train` and `export`: one line on stderr, exit code 2, no traceback, and
nothing left behind (no run directory, no process), checked before any process starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ratrain import checkpoint

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _children() -> list[int]:
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[1] == me:
                found.append(int(stat.parent.name))
        except (OSError, IndexError):
            pass
    return found


def _refused(monkeypatch, capsys, needle: str, *args: str) -> str:
    before = set(_children())  # earlier tests' helpers (multiprocessing's resource tracker) stay
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert set(_children()) <= before
    return lines[0]


def _trained_run(monkeypatch, capsys, tmp_path, name="run") -> Path:
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--run-dir", name, "--no-progress")
    assert code == 0, err
    return tmp_path / name


@pytest.mark.parametrize("args,needle", [
    (["--pp", "0"], "--pp and --dp must be >= 1, got pp=0 dp=1"),
    (["--dp", "-2"], "--pp and --dp must be >= 1, got pp=1 dp=-2"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints (train.keep_checkpoints) must be positive, got 0"),
    (["--comm-timeout", "0"], "--comm-timeout (parallel.comm_timeout_s) must be in (0, 604800] seconds, got 0"),
    (["--comm-timeout", "inf"], "--comm-timeout (parallel.comm_timeout_s) must be in (0, 604800] seconds, got inf"),
    (["--resume", "auto"], "--resume auto needs --run-dir"),
    (["--lr", "nan"], "--lr (train.lr) must be a finite number, got nan"),
    (["--lr", "inf"], "--lr (train.lr) must be a finite number, got inf"),
    (["--lr", "-inf"], "--lr (train.lr) must be a finite number, got -inf"),
    (["--dp", "2", "--global-batch", "3"],
     "--global-batch 3 (train.global_batch) is not a multiple of train.micro_batch_size 2 "
     "(the default: set "
     "--micro-batch-size)"),
    (["--global-batch", "6", "--micro-batch-size", "4"],
     "--global-batch 6 (train.global_batch) is not a multiple of --micro-batch-size 4 "
     "(train.micro_batch_size)"),
    (["--outer-lr", "0.5"], "--outer-lr 0.5 is for the outer step of --sync diloco:H, which "
     "this run does not take: it syncs every step (--sync step)"),
    (["--outer-momentum", "0.8"], "--outer-momentum 0.8 is for the outer step of --sync"),
    (["--outer-mix", "0.3"], "--outer-mix 0.3 is for the outer step of --sync"),
    (["--dp", "2", "--sync", "diloco:4", "--outer-mix", "0.3"], "--outer-mix 0.3 mixes a "
     "fragment's outer result into the local weights, which needs fragments: --sync diloco:H:F"),
])
def test_bad_flags(monkeypatch, capsys, tmp_path, args, needle):
    _refused(monkeypatch, capsys, needle, "train", "--no-progress", *args)
    assert not (tmp_path / "runs").exists()


def test_a_world_size_that_does_not_fit_pp_x_dp(tmp_path):
    # In a process of its own: under torchrun the CLI ends its process with os._exit.
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run([sys.executable, "-m", "ratrain.cli", "train", "--config",
                           str(small_config(tmp_path)), "--pp", "3", "--global-batch", "12",
                           "--run-dir", "run", "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: torchrun started 2 processes, but --pp 3 x --dp 1 "
                                   "needs 3"), proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_plan_file_that_does_not_fit_the_flags_or_the_model(monkeypatch, capsys, tmp_path):
    code, _, _ = run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--out", "p.json")
    assert code == 0
    _refused(monkeypatch, capsys, "--dp 2 differs from dp 1, which p.json was made for",
             "train", "--plan", "p.json", "--pp", "2", "--dp", "2", "--no-progress")
    _refused(monkeypatch, capsys, "p.json was made for model tiny (4 layers, dim 256); this run "
             "has small (2 layers, dim 32)",
             "train", "--plan", "p.json", "--config", str(small_config(tmp_path)), "--no-progress")
    assert not (tmp_path / "runs").exists()


def test_a_checkpoint_of_another_model(monkeypatch, capsys, tmp_path):
    run = _trained_run(monkeypatch, capsys, tmp_path)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["dim"] = 64
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    before = sorted(p.name for p in run.rglob("*"))
    _refused(monkeypatch, capsys, "is of another model: dim=32 (run has 64)",
             "train", "--resume", str(run), "--steps", "4", "--no-progress")
    assert sorted(p.name for p in run.rglob("*")) == before


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,needle", [
    (_truncate, "unit_0001.safetensors is truncated"),
    (_flip_a_bit, "unit_0001.safetensors does not match its sha256"),
])
def test_a_damaged_checkpoint_and_none_to_fall_back_to(monkeypatch, capsys, tmp_path, damage, needle):
    run = _trained_run(monkeypatch, capsys, tmp_path)
    for ckpt in checkpoint.complete_dirs(run):  # both kept checkpoints: steps 1 and 2
        damage(ckpt / "unit_0001.safetensors")
    before = sorted(p.name for p in run.rglob("*"))
    line = _refused(monkeypatch, capsys, "no checkpoint in", "train", "--resume", str(run),
                    "--steps", "4", "--no-progress")
    assert f"verifies: step_000002: {needle}" in line and f"step_000001: {needle}" in line
    _refused(monkeypatch, capsys, needle, "export", str(run), "--out", "hf")
    assert sorted(p.name for p in run.rglob("*")) == before and not (tmp_path / "hf").exists()


def test_a_diverging_run_stops_with_the_step_and_keeps_the_last_good_checkpoint(monkeypatch, capsys, tmp_path):
    cfg = small_config(tmp_path, lr=1e5, warmup_steps=0, steps=30)
    line = _refused(monkeypatch, capsys, "lower the learning rate",
                    "train", "--config", str(cfg), "--run-dir", "run", "--no-progress")
    step = int(line.split(" at step ")[1].split(";")[0])
    assert f"the last good checkpoint is step_{step - 1:06d}" in line
    assert checkpoint.latest(tmp_path / "run").name == f"step_{step - 1:06d}"


def test_resume_auto_refuses_another_run_in_the_same_directory(monkeypatch, capsys, tmp_path):
    run = _trained_run(monkeypatch, capsys, tmp_path)
    _refused(monkeypatch, capsys, "was started with other settings: --lr 0.003 (this command: 0.01)",
             "train", "--config", str(small_config(tmp_path)), "--lr", "0.01", "--run-dir", str(run),
             "--resume", "auto", "--steps", "4", "--no-progress")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--run-dir", str(run), "--resume", "auto", "--steps", "3", "--no-progress")
    assert code == 0, err
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_run_dir_under_a_file(monkeypatch, capsys, tmp_path):
    (tmp_path / "afile").write_text("")
    _refused(monkeypatch, capsys, "is not a directory",
             "train", "--run-dir", "afile/run", "--no-progress")


@pytest.fixture
def mount_tmpfs(tmp_path):
    """Mount a tmpfs of the given options (root only); skip where that is not allowed."""
    mounted = []

    def mount(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs",
                                                str(where)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=True)


def test_an_unwritable_run_dir(monkeypatch, capsys, tmp_path, mount_tmpfs):
    readonly = mount_tmpfs("ro,size=1m")
    _refused(monkeypatch, capsys, "is not writable: Read-only file system",
             "train", "--run-dir", str(readonly / "run"), "--no-progress")


def test_a_disk_without_room_for_a_checkpoint(monkeypatch, capsys, tmp_path, mount_tmpfs):
    small = mount_tmpfs("size=1m")
    line = _refused(monkeypatch, capsys, "not enough disk space",
                    "train", "--run-dir", str(small / "run"), "--no-progress")
    assert "1.05 MB free, a checkpoint of tiny takes about 41.12 MB" in line  # 3.4M params x 12 B
    assert not (small / "run").exists()


def test_free_space_is_checked_where_the_run_dir_will_be(monkeypatch, capsys, tmp_path):
    """The same check without a mount: the free space as the filesystem reports it."""
    asked = []

    def usage(path):
        asked.append(Path(path))
        return shutil._ntuple_diskusage(10 * 2**30, 10 * 2**30 - 2**20, 2**20)

    monkeypatch.setattr("ratrain.training.disk_room.shutil.disk_usage", usage)
    _refused(monkeypatch, capsys, "not enough disk space for new/run: 1.05 MB free",
             "train", "--run-dir", "new/run", "--no-progress")
    assert asked == [tmp_path] and not (tmp_path / "new").exists()


def test_a_model_that_does_not_fit_this_machines_memory(monkeypatch, capsys, tmp_path):
    """Refused in seconds, before any model is built: until 2026-11-27 llama2-7b on a 23 GB
    machine built its model for minutes and grew until the kernel killed it. (The memory the
    machine has is set here, so the test does not depend on the machine it runs on.)"""
    from ratrain.training import prepare

    monkeypatch.setattr(prepare, "available_host_bytes", lambda: 20 * 2**30)
    line = _refused(monkeypatch, capsys, "does not fit this machine's memory", "train",
                    "--model", "llama2-7b", "--no-checkpoints", "--no-progress")
    assert "its rank here would hold about 113.48 GB (optimizer 53.91 GB, masters 26.95 GB" in line
    assert "21.47 GB is available" in line
    line = _refused(monkeypatch, capsys, "does not fit", "train", "--model", "llama2-7b",
                    "--pp", "2", "--dp", "2", "--no-checkpoints", "--no-progress")
    assert "its 4 ranks here" in line and "--shard-state" in line
    assert not (tmp_path / "runs").exists()


def test_the_memory_check_weighs_the_ledgers_prediction(monkeypatch, capsys, tmp_path):
    """A byte under the prediction is refused, the prediction itself runs."""
    from ratrain.byte_units import decimal_bytes
    from ratrain.config import RunConfig
    from ratrain.setup import Machine, run_plan
    from ratrain.setup.memory_fit import stage_bytes
    from ratrain.sim.profile import load_profile
    from ratrain.training import prepare

    config = small_config(tmp_path, checkpoint_every=0)
    cfg = RunConfig.load(config)
    need = stage_bytes(cfg, run_plan(cfg, Machine()), load_profile("cpu-local"))[0].total
    assert 700_000 < need < 900_000  # (790,364: masters, gradients, AdamW, activations)
    monkeypatch.setattr(prepare, "available_host_bytes", lambda: need - 1)
    _refused(monkeypatch, capsys, f"its rank here would hold about {decimal_bytes(need)}",
             "train", "--config", str(config), "--run-dir", "run", "--no-progress",
             "--no-checkpoints")
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(prepare, "available_host_bytes", lambda: need)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(config), "--run-dir",
                           "run", "--no-progress", "--no-checkpoints")
    assert code == 0, err


def test_resuming_a_run_that_saved_no_checkpoint_says_why(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--run-dir", "run", "--no-progress", "--no-report", "--no-checkpoints")
    assert code == 0, err
    _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints: the run was started with "
             "--no-checkpoints and saved none", "train", "--resume", "run", "--steps", "4",
             "--no-progress")


def _started(tmp_path: Path, parallel: dict, train: dict | None = None) -> None:
    """A run directory `run` whose config.yaml has these settings (no checkpoint: a resume
    that gets past its settings stops at that)."""
    from ratrain.config import RunConfig

    cfg = RunConfig.load(small_config(tmp_path))
    for section, values in (("parallel", parallel), ("train", train or {})):
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    (tmp_path / "run").mkdir(exist_ok=True)
    cfg.save(tmp_path / "run" / "config.yaml")


def test_a_refusal_of_a_resumed_runs_setting_says_whose_it_is(monkeypatch, capsys, tmp_path):
    _started(tmp_path, {"dp": 2, "shard_state": True})
    resume = ("train", "--resume", "run", "--steps", "4", "--no-progress")
    line = _refused(monkeypatch, capsys, "--dp 1 has none to split over", *resume, "--dp", "1")
    assert line.endswith("(--shard-state comes from the resumed run, run/config.yaml; "
                         "--no-shard-state turns it off)")
    line = _refused(monkeypatch, capsys, "none to split over", *resume, "--dp", "1", "--shard-state")
    assert "comes from the resumed run" not in line  # typed now: the flag is the user's
    _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints", *resume, "--dp", "1",
             "--no-shard-state")
    # hybrid sharding and a short gradient lifetime go with the sharded state they were for
    _started(tmp_path, {"dp": 4, "shard_state": True, "shard_group": 2,
                        "grad_lifetime": "transient"})
    _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints", *resume, "--no-shard-state")


def test_a_resume_at_another_pp_splits_the_units_anew_and_says_whose_stages_are_wrong(
        monkeypatch, capsys, tmp_path):
    """The run's --partition and per-stage --activation, made for its own --pp, were refused
    at another ("units_per_stage [1, 3] has 2 entries for pp=1", from no flag typed), and
    --partition '' could not clear them."""
    _started(tmp_path, {"pp": 2, "partition": [1, 3], "activation": "recompute,keep"})
    resume = ("train", "--resume", "run", "--steps", "4", "--no-progress", "--pp", "1")
    code, _, err = run_cli(monkeypatch, capsys, *resume)
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [
        "note: the resumed run's --partition 1,3 was for its 2 stages; at --pp 1 the units are "
        "split evenly (--partition sets them)",
        "error: --activation lists 2 policies for 1 stages; give one, or one per stage "
        "(--activation comes from the resumed run, run/config.yaml; --activation with one "
        "policy, or one per stage, replaces it)"]
    code, _, err = run_cli(monkeypatch, capsys, *resume, "--activation", "keep")
    assert err.strip().splitlines()[1:] == [  # past its settings: there is no checkpoint
        "error: no checkpoint in run/checkpoints: the run saves one every step and at its "
        "end, and had not reached one"]
    _refused(monkeypatch, capsys, "--partition 1,3 gives 2 stages' units for 3 stages", "train",
             "--resume", "run", "--steps", "4", "--no-progress", "--pp", "3", "--partition", "1,3", "--activation", "keep")
    from ratrain.cli.options import _FIELDS, build_config

    opts = dict.fromkeys([*_FIELDS, "model", "config_file", "partition"])
    assert build_config(opts, "run").parallel.partition == [1, 3]  # the same pp: the run's,
    assert build_config({**opts, "partition": ""}, "run").parallel.partition is None  # or even


def test_outer_flags_count_only_where_typed(monkeypatch, capsys, tmp_path):
    """A DiLoCo run's config keeps its outer values when it goes on synchronously."""
    _started(tmp_path, {"dp": 2, "sync": "diloco:2"}, {"outer_lr": 0.5})
    resume = ("train", "--resume", "run", "--steps", "4", "--no-progress")
    _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints", *resume, "--sync", "step")
    _refused(monkeypatch, capsys, "--outer-lr 0.6 is for the outer step", *resume,
             "--sync", "step", "--outer-lr", "0.6")
    _refused(monkeypatch, capsys, "no checkpoint in run/checkpoints", *resume, "--outer-lr", "0.6")


def test_export_of_a_directory_that_is_no_run(monkeypatch, capsys, tmp_path):
    """One that is not there was said to be "not a ratrain run directory" (until 2026-12-03)."""
    (tmp_path / "notarun").mkdir()
    for where, said in (("notarun", "notarun is not a ratrain run directory (no config.yaml)"),
                        ("missing", "missing: no such directory")):
        _refused(monkeypatch, capsys, said, "export", where, "--out", "hf")
    assert not (tmp_path / "hf").exists()


def test_a_diverging_float16_run_names_bfloat16(monkeypatch, capsys, tmp_path):
    """float16's loss scale guards the gradients; an activation past 65504 is a nan loss it
    cannot skip, and the line said only "lower the learning rate"."""
    cfg = small_config(tmp_path, lr=1e5, warmup_steps=0, steps=30)
    line = _refused(monkeypatch, capsys, "lower the learning rate", "train", "--config", str(cfg),
                    "--dtype", "float16", "--run-dir", "run", "--no-progress")
    assert "or train in bfloat16 (--dtype bfloat16" in line
