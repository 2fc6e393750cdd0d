"""The checkpoint options of `ratrain train`: --no-checkpoints (none saved, no disk check),
--checkpoint-dir (saved there, resumed from there, its filesystem checked), --checkpoint-sync /
--checkpoint-async, their config fields and their one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ratrain import checkpoint
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.metrics import read_metrics

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _config(tmp_path: Path, **train) -> Path:
    """small_config with 4 steps, a checkpoint every 2."""
    return small_config(tmp_path, **{"steps": 4, "checkpoint_every": 2, **train})


def _train(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", "--no-report",
                           "--no-trace", *args)
    return code, err


def _refused(monkeypatch, capsys, needle: str, *args: str) -> str:
    code, err = _train(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: room for a run's small files, not for a checkpoint (root only)."""
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs",
                                            str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_no_checkpoints_saves_none_and_skips_the_disk_check(monkeypatch, capsys, tmp_path, tiny_disk):
    cfg = str(_config(tmp_path))
    line = _refused(monkeypatch, capsys, "not enough disk space for", "--config", cfg,
                    "--run-dir", str(tiny_disk / "run"))
    assert "--no-checkpoints saves none" in line
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", str(tiny_disk / "run"),
                       "--no-checkpoints")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(tiny_disk / "run" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert not (tiny_disk / "run" / "checkpoints").exists()
    assert RunConfig.load(tiny_disk / "run" / "config.yaml").train.checkpoints is False


def test_checkpoint_dir_takes_the_checkpoints_and_its_disk_is_the_one_checked(
        monkeypatch, capsys, tmp_path, tiny_disk):
    cfg = str(_config(tmp_path))
    # the run directory has no room for a checkpoint, the checkpoint directory has: it runs
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", str(tiny_disk / "run"),
                       "--checkpoint-dir", "ckpts", "--checkpoint-sync")
    assert code == 0, err
    assert [p.name for p in checkpoint.complete_dirs(checkpoint.Elsewhere(tmp_path / "ckpts"))] == [
        "step_000002", "step_000004"]
    assert not (tiny_disk / "run" / "checkpoints").exists()
    saved = RunConfig.load(tiny_disk / "run" / "config.yaml").train
    assert saved.checkpoint_dir == str(tmp_path / "ckpts") and saved.checkpoint_async is False
    # and the other way round: the checkpoint directory's filesystem is the one refused
    _refused(monkeypatch, capsys, f"not enough disk space for {tiny_disk / 'ckpts'}: ",
             "--config", cfg, "--run-dir", "run2", "--checkpoint-dir", str(tiny_disk / "ckpts"))
    assert not (tmp_path / "run2").exists()


def test_a_run_resumes_from_its_checkpoint_dir(monkeypatch, capsys, tmp_path):
    cfg = str(_config(tmp_path))
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run",
                       "--checkpoint-dir", "ckpts")
    assert code == 0, err
    shutil.rmtree(tmp_path / "ckpts" / "step_000004")  # as if the run had died after step 2
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--steps", "6")
    assert code == 0, err
    assert [p.name for p in checkpoint.complete_dirs(checkpoint.Elsewhere(tmp_path / "ckpts"))] == [
        "step_000004", "step_000006"]
    assert checkpoint.load_meta(tmp_path / "ckpts" / "step_000006")["loader"]["step"] == 6
    # --resume auto looks in the checkpoint directory too: it continues, from step 6
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto", "--checkpoint-dir", "ckpts", "--steps", "8")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == list(range(1, 9))
    # a new run does not take a directory that holds another run's checkpoints
    _refused(monkeypatch, capsys, f"checkpoint directory {tmp_path / 'ckpts'} holds checkpoints "
             "already (step_000008)", "--config", cfg, "--run-dir", "other",
             "--checkpoint-dir", "ckpts")


def test_resume_auto_looks_where_the_runs_config_says(monkeypatch, capsys, tmp_path):
    """A restarted job's command line, repeated without --checkpoint-dir: until 2026-11-29 it
    found no checkpoint in RUN/checkpoints and started the run over."""
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run",
                  "--checkpoint-dir", "ckpts")[0] == 0
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run", "--resume",
                       "auto", "--steps", "6")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == list(range(1, 7))
    assert (tmp_path / "ckpts" / "step_000006").is_dir() and not (tmp_path / "run" / "checkpoints").exists()


def test_a_moved_checkpoint_dir_is_said_to_be_gone_and_found_with_the_flag(
        monkeypatch, capsys, tmp_path):
    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run",
                  "--checkpoint-dir", "ckpts")[0] == 0
    (tmp_path / "ckpts").rename(tmp_path / "moved")
    gone = (f"the run's checkpoint directory {tmp_path / 'ckpts'} (config.yaml's "
            "train.checkpoint_dir) does not exist (moved or deleted?), though the run reached "
            "step 4; resume with --checkpoint-dir DIR to say where it is now")
    assert _refused(monkeypatch, capsys, gone, "--resume", "run", "--steps", "6") == f"error: {gone}"
    _refused(monkeypatch, capsys, f"--resume auto: {gone}", "--config", cfg, "--run-dir", "run",
             "--resume", "auto", "--steps", "6")  # not a new run over its files
    code, _, err = run_cli(monkeypatch, capsys, "export", "run", "--out", "hf")
    assert code == 2 and err.strip().endswith(  # (it said "resume with --checkpoint-dir DIR")
        "though the run reached step 4; export with `ratrain export run --out hf "
        "--checkpoint-dir DIR` to say where it is now"), err
    _refused(monkeypatch, capsys, f"--checkpoint-dir {tmp_path / 'nowhere'} does not exist",
             "--resume", "run", "--steps", "6", "--checkpoint-dir", "nowhere")
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--steps", "6",
                       "--checkpoint-dir", "moved")
    assert code == 0, err
    assert checkpoint.load_meta(tmp_path / "moved" / "step_000006")["loader"]["step"] == 6
    assert RunConfig.load(tmp_path / "run" / "config.yaml").train.checkpoint_dir == str(tmp_path / "moved")


@pytest.mark.parametrize("args,needle", [
    (["--checkpoint-dir", ""], "train.checkpoint_dir must name a directory, got an empty string"),
    (["--checkpoint-dir", "small.yaml"], "cannot make checkpoint directory"),
])
def test_bad_checkpoint_flags_are_one_line(monkeypatch, capsys, tmp_path, args, needle):
    _refused(monkeypatch, capsys, needle, "--config", str(_config(tmp_path)), "--run-dir", "run",
             *args)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args,needle", [
    (["--checkpoint-every", "5"], "--checkpoint-every 5 is for the run's checkpoints, and this "
     "run saves none (--no-checkpoints): leave the flag out"),
    (["--checkpoint-sync"], "--checkpoint-sync is for"),
    (["--checkpoint-dir", "d"], "--checkpoint-dir d is for the run's checkpoints, and this run "
     "saves none (--no-checkpoints; --checkpoint-on-interrupt saves one on Ctrl-C)"),
    (["--keep-checkpoints", "3"], "--keep-checkpoints 3 is for"),
    (["--checkpoint-on-interrupt", "--checkpoint-async"], "--checkpoint-async is for"),
])
def test_checkpoint_flags_with_no_checkpoints_are_refused(monkeypatch, capsys, tmp_path, args,
                                                          needle):
    """They were taken and did nothing."""
    _refused(monkeypatch, capsys, needle, "--config", str(_config(tmp_path)), "--run-dir", "run",
             "--no-checkpoints", *args)
    assert not (tmp_path / "run").exists()
    from ratrain.cli.train_resume import refuse_idle_checkpoint_flags

    cfg = RunConfig()
    cfg.train.checkpoints, cfg.train.checkpoint_on_interrupt = False, True
    refuse_idle_checkpoint_flags(cfg, {"checkpoint_dir": "d", "keep_checkpoints": 3})  # Ctrl-C's
    cfg.train.checkpoint_on_interrupt = False
    with pytest.raises(UserError, match=r"\(train.checkpoints: false in its config; "
                       r"--checkpoints turns them on;"):  # from a config file or the resumed run
        refuse_idle_checkpoint_flags(cfg, {"checkpoint_dir": "d"})


@pytest.mark.parametrize("train,needle", [
    ({"checkpoints": "no"}, "train.checkpoints: expected true or false, got 'no'"),
    ({"checkpoint_async": 1}, "train.checkpoint_async: expected true or false, got 1"),
    ({"checkpoint_dir": 7}, "train.checkpoint_dir: expected a string, got 7"),
])
def test_bad_checkpoint_fields_in_a_config_are_one_line(monkeypatch, capsys, tmp_path, train, needle):
    _refused(monkeypatch, capsys, needle, "--config", str(_config(tmp_path, **train)))


def test_the_checkpoint_fields_round_trip_through_yaml_and_json(tmp_path):
    cfg = RunConfig()
    cfg.train.checkpoints, cfg.train.checkpoint_async = False, False
    cfg.train.checkpoint_dir = "/mnt/big/ckpts"
    for name in ("run.yaml", "run.json"):
        cfg.save(tmp_path / name)
        assert RunConfig.load(tmp_path / name) == cfg
    assert json.loads((tmp_path / "run.json").read_text())["train"]["checkpoint_dir"] == "/mnt/big/ckpts"
    assert RunConfig().train.checkpoints and RunConfig().train.checkpoint_async  # the defaults
    with pytest.raises(UserError, match="must name a directory"):
        RunConfig.from_dict({"train": {"checkpoint_dir": "  "}}).validate()


def _free(monkeypatch, mib: float) -> None:
    monkeypatch.setattr("ratrain.training.disk_room.shutil.disk_usage",
                        lambda path: shutil._ntuple_diskusage(1 << 40, 0, int(mib * 2**20)))


def test_the_disk_check_counts_the_checkpoints_on_disk_at_once(monkeypatch):
    """While one is written the newest --keep-checkpoints stay: the default run (300 steps, a
    checkpoint every 100, keep 2) has three of 41.12 MB on disk at its third save."""
    from ratrain.training.disk_room import checkpoints_at_once
    from ratrain.training.run_dir import check_run_dir

    cfg = RunConfig()  # the tiny preset: 3.4M parameters, 41.12 MB a checkpoint
    assert checkpoints_at_once(cfg) == 3
    _free(monkeypatch, 100)
    with pytest.raises(UserError, match=r"104.86 MB free, a checkpoint of .* takes about 41.12 MB "
                       r"and this run needs room for 3 at once .*: 123.36 MB \(--keep-checkpoints"):
        check_run_dir(Path("run"), cfg)
    cfg.train.keep_checkpoints = 1  # two at once
    check_run_dir(Path("run"), cfg)
    cfg.train.keep_checkpoints, cfg.train.checkpoint_every = 2, 200  # saves at 200 and 300
    assert checkpoints_at_once(cfg) == 2
    cfg.train.checkpoint_every = 0  # only at the end
    assert checkpoints_at_once(cfg) == 1
    cfg.train.checkpoint_every, cfg.train.steps = 100, 600
    assert checkpoints_at_once(cfg, start=300, existing=2) == 1  # two there, a third at a time
    assert checkpoints_at_once(cfg, start=500, existing=1) == 1  # only the end's to come
    assert checkpoints_at_once(cfg, start=300, existing=0) == 3  # (moved away meanwhile)


def test_a_diloco_checkpoint_holds_every_replicas_state_and_the_outer_state(monkeypatch):
    from ratrain.training.disk_room import checkpoint_bytes
    from ratrain.training.run_dir import check_run_dir

    cfg = RunConfig()
    cfg.train.checkpoint_every = 0
    one = checkpoint_bytes(cfg)
    cfg.parallel.dp, cfg.parallel.sync = 4, "diloco:50"
    assert checkpoint_bytes(cfg) == 4 * one + one * 8 // 12
    _free(monkeypatch, 2 * one / 2**20)
    with pytest.raises(UserError, match=r"every replica's weights and AdamW state, and the "
                       r"outer state\) takes about 191.89 MB \(--checkpoint-dir"):
        check_run_dir(Path("run"), cfg)
    cfg.parallel.sync = "diloco:50:islands=2"  # an island's replicas hold one state
    assert checkpoint_bytes(cfg) == 2 * one + one * 8 // 12


def test_an_islands_first_replica_in_a_directory_writes_its_state():
    from ratrain.schedule.grid import RankGrid
    from ratrain.training.disk_room import part_bytes
    from ratrain.training.shared_dir import DirectoryShare

    grid = RankGrid(1, 4)
    node_1 = DirectoryShare((1, 2, 3))  # replicas 1-3: island 0's second, island 1's two
    assert [node_1.first_of_stage(grid, r, 2) for r in (1, 2, 3)] == [True, True, False]
    assert [node_1.first_of_stage(grid, r) for r in (1, 2, 3)] == [True, False, False]
    cfg = RunConfig()
    cfg.parallel.dp, cfg.parallel.sync = 4, "diloco:50:islands=2"
    units = [range(cfg.model.n_units)]
    one_island = part_bytes(cfg, grid, units, [0, 1])
    assert part_bytes(cfg, grid, units, [1, 2, 3]) == part_bytes(cfg, grid, units, [0, 1, 2, 3])
    assert part_bytes(cfg, grid, units, [0, 1, 2, 3]) > one_island


def test_a_resumed_run_counts_the_checkpoints_its_directory_holds(monkeypatch, capsys, tmp_path):
    cfg = str(_config(tmp_path, keep_checkpoints=2))
    code, err = _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")
    assert code == 0, err  # checkpoints at 2 and 4, 445.1 kB each
    size = RunConfig.load(tmp_path / "run" / "config.yaml")
    from ratrain.training.disk_room import checkpoint_bytes

    each = checkpoint_bytes(size) / 2**20
    _free(monkeypatch, 1.5 * each)  # to step 8: one more at a time beside the two there
    code, err = _train(monkeypatch, capsys, "--resume", "run", "--steps", "8")
    assert code == 0, err
    _free(monkeypatch, 0.5 * each)
    _refused(monkeypatch, capsys, "not enough disk space", "--resume", "run", "--steps", "12")


@pytest.mark.parametrize("stepped", [False, True])
def test_a_resumed_run_that_fails_before_its_first_step_leaves_its_files_as_they_were(
        monkeypatch, capsys, tmp_path, stepped):
    """Its config, plan and the earlier part's summary: a failed attempt's settings never ran,
    and the next attempt would take them up from config.yaml. One that trained a step before
    failing keeps the settings it trained with."""
    from ratrain.training import run as run_module

    cfg = str(_config(tmp_path))
    assert _train(monkeypatch, capsys, "--config", cfg, "--run-dir", "run")[0] == 0
    before = {n: (tmp_path / "run" / n).read_bytes() for n in ("config.yaml", "summary.json")}

    def fails(cfg, run_dir, *args, **kwargs):
        if stepped:
            with open(Path(run_dir) / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": 5, "loss": 1.0}) + "\n")
        raise RuntimeError("a failure at the start")

    monkeypatch.setattr(run_module, "rank_main", fails)
    resumed = RunConfig.load(tmp_path / "run" / "config.yaml")
    resumed.train.steps, resumed.train.eval_every = 6, 3
    with pytest.raises(RuntimeError, match="a failure at the start"):
        run_module.train(resumed, tmp_path / "run", resume=True, progress=False)
    config = (tmp_path / "run" / "config.yaml").read_bytes()
    assert (config == before["config.yaml"]) != stepped
    assert (tmp_path / "run" / "summary.json").exists() != stepped


@pytest.mark.parametrize("text, wait", [(None, 10.0), ("2", 2.0), ("0", 0.0), ("x", None),
                                        ("-1", None), ("nan", None), ("inf", None)])
def test_the_shared_directory_wait_is_set_by_its_variable(monkeypatch, text, wait):
    from ratrain.training.shared_dir import _wait_s

    if text is None:
        monkeypatch.delenv("RATRAIN_SHARED_DIR_WAIT_S", raising=False)
    else:
        monkeypatch.setenv("RATRAIN_SHARED_DIR_WAIT_S", text)
    if wait is None:
        with pytest.raises(UserError, match="RATRAIN_SHARED_DIR_WAIT_S="):
            _wait_s()
    else:
        assert _wait_s() == wait
