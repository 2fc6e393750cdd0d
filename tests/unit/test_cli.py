"""The command line: machine-readable output, and one clear line with exit code 2 for a user's
mistake (no traceback), before any run directory is created."""

from __future__ import annotations

import json

import yaml

import pytest

from ratrain.cli.options import resolve_model
from ratrain.config import RunConfig
from ratrain.data.tokenizer import train_bpe
from ratrain.data.corpus import stdlib_files

from .cli_runner import run_cli, small_config


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def test_models_json_lists_presets_with_state_bytes(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "models", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["llama2-7b"]["params"] == 6_738_415_616
    assert rows["llama2-70b"]["optimizer"] == 8 * rows["llama2-70b"]["params"]
    assert {"tiny", "baichuan2-13b", "qwen2.5-32b"} <= set(rows)


def test_models_table(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "models")
    assert code == 0
    assert "qwen2.5-32b" in out and "32.76B" in out
    llama7b = next(line for line in out.splitlines() if line.startswith("llama2-7b"))
    assert "13.48 GB" in llama7b and "121.29 GB" in llama7b  # bf16 view + 16 B/param of state


def _tiny_text(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    (data / "a.txt").write_text("hello world\n" * 50)
    return data


@pytest.mark.parametrize("args,needle", [
    (["--model", "no-such-model"], "unknown model preset 'no-such-model'"),
    (["--model", "no/such/dir"], "--model no/such/dir: no such directory (a Hugging Face model"),
    (["--data", "/no/such/path"], "data path not found"),
    (["--pp", "4", "--global-batch", "4", "--micro-batch-size", "2"], "fewer than pp=4"),
    (["--partition", "2,x"], "--partition"),
    (["--partition", "4,4", "--pp", "2"], "--partition 4,4 places 8 units; the model has 6"),
    (["--global-batch", "6", "--micro-batch-size", "4"], "not a multiple"),
    (["--seq-len", "4096"], "max_seq_len"),
    (["--resume", "nowhere"], "--resume nowhere: no such directory"),
    (["--activation", "keep,fast"], "activation policy must be one of keep, recompute, offload"),
    (["--pp", "2", "--activation", "keep,keep,keep"], "lists 3 policies for 2 stages"),
    (["--pp", "2", "--policy", "baseline", "--activation", "recompute,keep"], "use --policy ratrain"),
    (["--dtype", "bfloat16", "--view-window", "-1"], "--view-window must be >= 0"),
])
def test_user_mistakes_exit_2_with_one_line(monkeypatch, capsys, tmp_path, args, needle):
    code, out, err = run_cli(monkeypatch, capsys, "train", "--no-progress", *args)
    assert code == 2, err
    assert needle in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_tokenizer_too_big_for_model(monkeypatch, capsys, tmp_path):
    tok = tmp_path / "tok.json"
    train_bpe(stdlib_files()[:40], 700, tok)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--tokenizer", str(tok), "--no-progress")
    assert code == 2
    assert "has 700 tokens but the model's vocabulary is 512" in err


def test_unsupported_hf_architecture(monkeypatch, capsys, tmp_path):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                   "model_type": "gpt2"}))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", str(model), "--no-progress")
    assert code == 2
    assert "unsupported architecture 'GPT2LMHeadModel'" in err
    assert len(err.strip().splitlines()) == 1


def test_a_run_from_a_hugging_face_directory_resumes_without_it(monkeypatch, capsys, tmp_path):
    """The checkpoint holds the weights: the starting directory, moved since (or named relative
    to another working directory), is not read (refused until 2026-11-29). Weights in .bin
    files, which ratrain does not read, are refused, not replaced by random ones."""
    from ratrain.models.hf import save_hf
    from ratrain.models.llama import build_units
    from ratrain.models.presets import get_preset

    model = get_preset("tiny")
    save_hf(build_units(model, 0), model, tmp_path / "hf")
    run = ("--seq-len", "32", "--global-batch", "8", "--no-progress", "--no-report")
    (tmp_path / "text.txt").write_text("hello world\n" * 1000)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", str(tmp_path / "hf"),
                           "--data", str(tmp_path / "text.txt"), "--steps", "2", "--run-dir",
                           str(tmp_path / "run"), *run)
    assert code == 0, err
    (tmp_path / "hf").rename(tmp_path / "moved")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "run"),
                           "--steps", "3", *run)
    assert code == 0, err
    (tmp_path / "moved" / "model.safetensors").rename(tmp_path / "moved" / "pytorch_model.bin")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--model", str(tmp_path / "moved"), *run)
    assert code == 2 and "its weights are PyTorch .bin files" in err, err


def test_tokenizer_command_trains_bpe(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(_tiny_text(tmp_path)),
                           "--vocab-size", "300", "--out", str(tmp_path / "tok"))
    assert code == 0
    assert (tmp_path / "tok" / "tokenizer.json").is_file()


def test_tokenizer_of_an_empty_corpus_is_refused_and_a_short_one_says_so(monkeypatch, capsys,
                                                                          tmp_path):
    """An empty corpus wrote the 257 bytes' tokenizer, and a small one fewer tokens than asked,
    both said only by the count."""
    (tmp_path / "empty.txt").write_text("")
    code, _, err = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(tmp_path / "empty.txt"),
                           "--out", str(tmp_path / "e.json"))
    assert code == 2 and "it is empty: there is no text to train a tokenizer on" in err, err
    assert not (tmp_path / "e.json").exists()
    (tmp_path / "few.txt").write_text("ab ab ab ab\n" * 50)
    code, out, err = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(tmp_path / "few.txt"),
                             "--vocab-size", "400", "--out", str(tmp_path / "f.json"))
    assert code == 0, err
    assert "the corpus gave no more merges than that, of the 400 asked)" in out, out


@pytest.mark.parametrize("out,written", [
    ("tok.v1/", "tok.v1/tokenizer.json"),  # was a file tok.v1: Path drops the slash
    ("made.v2", "made.v2/tokenizer.json"),  # an existing directory
    ("tok.json", "tok.json"),
    ("tok.v3", "tok.v3"),  # a suffix and no slash: a file, as before
])
def test_tokenizer_out_with_a_dot_and_a_slash_is_a_directory(monkeypatch, capsys, tmp_path, out,
                                                             written):
    (tmp_path / "made.v2").mkdir()
    code, _, err = run_cli(monkeypatch, capsys, "tokenizer", "--data", str(_tiny_text(tmp_path)),
                           "--vocab-size", "260", "--out", f"{tmp_path}/{out}")
    assert code == 0, err
    assert json.loads((tmp_path / written).read_text())["model"]


def test_plan_prints_the_programs_and_writes_json(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--out", str(tmp_path / "p.json"))
    assert code == 0
    assert "Stage 0" in out and "Stage 1" in out and "SA2.0" in out
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["pp"] == 2 and plan["n_micro"] == 4
    assert plan["programs"][1].split()[-1] == "E"


def test_plan_policy_and_rank_order_are_recorded(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--dp", "2",
                           "--global-batch", "16", "--out", str(tmp_path / "r.json"))
    assert code == 0 and out.startswith("ratrain 1f1b, pp=2 dp=2 rank order pp-dp")
    plan = json.loads((tmp_path / "r.json").read_text())
    assert (plan["policy"], plan["rank_order"]) == ("ratrain", "pp-dp")
    assert "GS2 B1.3" in plan["programs"][0]  # unit 2's sync runs under unit 1's backward

    code, out, _ = run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--dp", "2",
                           "--global-batch", "16", "--policy", "baseline", "--rank-order",
                           "dp-pp", "--json")
    plan = json.loads(out)
    assert code == 0 and (plan["policy"], plan["rank_order"]) == ("baseline", "dp-pp")
    assert "GS2 B1.3" not in plan["programs"][0]


def test_a_plan_file_of_another_policy_or_order_is_refused(monkeypatch, capsys, tmp_path):
    run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--policy", "baseline",
            "--out", str(tmp_path / "p.json"))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(tmp_path / "p.json"),
                           "--policy", "ratrain", "--no-progress")
    assert code == 2 and "--policy ratrain differs from policy baseline, which" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_broken_plan_file_is_refused_with_the_table(monkeypatch, capsys, tmp_path):
    run_cli(monkeypatch, capsys, "plan", "--pp", "2", "--out", str(tmp_path / "p.json"))
    plan = json.loads((tmp_path / "p.json").read_text())
    # Stage 1 waits for micro-batch 1's activation before posting its receive: never arrives.
    actions = plan["programs"][1].split()
    i, j = actions.index("RA2.1"), actions.index("WRA2.1")
    actions[i], actions[j] = actions[j], actions[i]
    plan["programs"][1] = " ".join(actions)
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(tmp_path / "bad.json"),
                           "--no-progress")
    assert code == 2
    assert "fails the schedule checks" in err and ">>" in err and "Stage 1" in err
    assert not (tmp_path / "runs").exists()


def test_a_plan_file_is_read_even_for_one_process(monkeypatch, capsys, tmp_path):
    """With pp = dp = 1 a plan file is checked and run, never ignored (random bytes: refused)."""
    (tmp_path / "junk.json").write_bytes(bytes(range(256)) * 3)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", str(tmp_path / "junk.json"),
                           "--no-progress")
    assert code == 2 and "is not a ratrain plan" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
    run_cli(monkeypatch, capsys, "plan", "--activation", "offload", "--out", str(tmp_path / "p.json"))
    code, out, err = run_cli(monkeypatch, capsys, "train", "--plan", str(tmp_path / "p.json"),
                             "--steps", "2", "--no-progress", "--run-dir", "one")
    assert code == 0, err
    ran = json.loads((tmp_path / "one" / "plan.json").read_text())
    assert any(a.startswith("O") for a in ran["programs"][0].split())  # the plan's offload ran
    assert "peak memory held (ledger): stage 0:" in out


def test_too_little_data_is_refused_before_the_run(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--data", str(_tiny_text(tmp_path)),
                           "--no-progress")
    assert code == 2, err
    assert "error:" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text,needle", [
    ("train:\n  lr: fast\n", "train.lr: expected a number, got 'fast'"),
    ("train:\n  steps: 2.5\n", "train.steps: expected a whole number, got 2.5"),
    ("train:\n  beta2: 1.5\n", "train.beta2 must be in [0, 1), got 1.5"),
    ("parallel:\n  pp: two\n", "parallel.pp: expected a number, got 'two'"),
    ("trian:\n  lr: 0.1\n", "unknown config section(s): trian"),
    ("train: [1, 2]\n", "train: expected a mapping, got [1, 2]"),
    ("train:\n  lr: [\n", "cannot parse config"),
])
def test_config_file_mistakes_are_named_with_their_path(monkeypatch, capsys, tmp_path, text, needle):
    (tmp_path / "run.yaml").write_text(text)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(tmp_path / "run.yaml"),
                           "--no-progress")
    assert code == 2 and needle in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_yaml_3e_3_is_read_as_a_number(tmp_path):
    (tmp_path / "run.yaml").write_text("train:\n  lr: 3e-3\n")  # YAML 1.1: a string
    assert RunConfig.load(tmp_path / "run.yaml").train.lr == 3e-3


def test_a_saved_config_replaces_the_file_whole(tmp_path):
    """Under torchrun rank 0 rewrites a resumed run's config.yaml while a later rank may be
    reading it: a reader holds the old file or the new, never one truncated under it."""
    path = tmp_path / "config.yaml"
    RunConfig().save(path)
    with open(path) as reading:
        cfg = RunConfig()
        cfg.train.lr = 1.25e-4
        cfg.save(path)
        assert RunConfig.from_dict(yaml.safe_load(reading.read())).train.lr == RunConfig().train.lr
    assert RunConfig.load(path).train.lr == 1.25e-4
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_ranks_that_share_a_machine_split_its_cores(monkeypatch):
    """The ranks ratrain launches split the cores, at least one thread each, on CPUs as on GPUs
    (one each left 14 of 16 cores idle at pp 2); so do torchrun's several a node, whose
    OMP_NUM_THREADS=1 is torchrun's default, not the user's; a larger OMP_NUM_THREADS is
    kept, and --threads decides over both."""
    from ratrain.training.prepare import threads_in_this_process, threads_per_rank

    cfg = RunConfig()
    monkeypatch.setattr("ratrain.training.prepare.usable_cores", lambda: 16)
    assert [threads_per_rank(cfg, n) for n in (1, 2, 3, 4, 32)] == [16, 8, 5, 4, 1]
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
                 "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    assert threads_in_this_process(cfg) is None  # one process: torch's default
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun, one rank a node
    assert threads_in_this_process(cfg) is None
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert threads_in_this_process(cfg) == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what torchrun sets for such ranks
    assert threads_in_this_process(cfg) == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "6")  # a user's own
    assert threads_in_this_process(cfg) is None
    cfg.parallel.threads_per_rank = 3
    assert threads_in_this_process(cfg) == 3 and threads_per_rank(cfg, 4) == 3


def test_the_cores_a_process_may_use_are_its_affinity_not_the_machines():
    """taskset, a container's cpuset or a batch job's allocation: ranks given one core of
    this machine split that one, not all of them."""
    import subprocess
    import sys

    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from ratrain.host_cores import usable_cores; print(usable_cores())")
    one = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert one.strip() == "1"


def test_threads_apply_to_a_run_in_this_process_and_are_given_back(monkeypatch, capsys,
                                                                     tmp_path):
    """--threads for one process is the run's thread count (the summary says what the steps
    computed on), and the caller's count is back after it. The summary's tokens/s is the
    tokens of the steps after the first over their time (not a mean of their rates)."""
    import torch

    before = torch.get_num_threads()
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(small_config(tmp_path)),
                           "--threads", str(before + 1), "--run-dir", str(tmp_path / "run"),
                           "--no-progress", "--no-report", "--steps", "3")
    assert code == 0, err
    from ratrain.host_cores import usable_cores

    # more threads than cores: said, not silently slow
    assert ("outnumber the cores" in err) == (before + 1 > usable_cores()), err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["threads_per_rank"] == before + 1
    from ratrain.training.metrics import read_metrics

    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")[1:]
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in rows)
    assert len(rows) >= 2
    assert summary["tokens_per_s"] == pytest.approx(tokens / sum(r["step_time_s"] for r in rows))
    assert torch.get_num_threads() == before


def test_resuming_refuses_a_changed_setting_but_not_the_same_one_repeated(monkeypatch, capsys,
                                                                         tmp_path):
    """A job's command line, repeated with --resume, names the run's own settings again."""
    (tmp_path / "run").mkdir()
    RunConfig().save(tmp_path / "run" / "config.yaml")  # seq_len 256, micro-batches of 2
    resume = ("train", "--resume", str(tmp_path / "run"), "--no-progress")
    code, _, err = run_cli(monkeypatch, capsys, *resume, "--seq-len", "256",
                           "--micro-batch-size", "2")
    assert code == 2 and "cannot change" not in err and "no checkpoint" in err, err
    code, _, err = run_cli(monkeypatch, capsys, *resume, "--seq-len", "128",
                           "--micro-batch-size", "2")
    assert code == 2 and err.strip() == ("error: cannot change --seq-len (256 -> 128) when "
                                         "resuming; start a new run instead"), err
    code, _, err = run_cli(monkeypatch, capsys, *resume, "--model", "tiny")
    assert code == 2 and "cannot change --model (custom -> tiny) when resuming" in err, err
    tiny = RunConfig()
    resolve_model("tiny", tiny)
    tiny.save(tmp_path / "run" / "config.yaml")
    code, _, err = run_cli(monkeypatch, capsys, *resume, "--model", "tiny")  # (refused until
    assert code == 2 and "cannot change" not in err and "no checkpoint" in err, err  # 11-29)


def test_a_resume_says_when_the_training_data_changed(monkeypatch, capsys, tmp_path):
    """The checkpoint kept only the loader's step: a resume on a changed corpus drew other
    sequences without a word. It now says so (and trains on)."""
    import shutil

    config = str(small_config(tmp_path))
    run = ("--run-dir", str(tmp_path / "run"), "--no-progress", "--no-report")
    assert run_cli(monkeypatch, capsys, "train", "--config", config, *run)[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "run"),
                           "--steps", "3", "--no-progress", "--no-report")
    assert code == 0 and "data changed" not in err, err
    shutil.copy(next(f for f in stdlib_files() if f.name == "shlex.py"), tmp_path / "text")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "run"),
                           "--steps", "4", "--no-progress", "--no-report")
    assert code == 0, err
    assert "the training data changed since the checkpoint (" in err
    assert "the sequences are drawn anew from step 4 on" in err


def test_a_resume_past_a_torn_metrics_line_says_the_lr_jump_and_drops_a_stale_trace(
        monkeypatch, capsys, tmp_path):
    """Three things a long run met on resume: a last metrics line cut short by a crash stopped
    every later resume at a JSON error; a larger --steps stretched the cosine without a word
    (the learning rate jumps at the resumed step); and an earlier part's trace.json stayed
    beside a part that wrote none, which the report then showed as this run's."""
    from ratrain.training.metrics import read_metrics

    config = str(small_config(tmp_path, steps=4, warmup_steps=0))
    run = tmp_path / "run"
    args = ("--no-progress", "--no-report")
    assert run_cli(monkeypatch, capsys, "train", "--config", config, "--run-dir", str(run),
                   *args)[0] == 0
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # the machine died here
    (run / "trace.json").write_text("{}")
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(run), "--steps", "8",
                           *args)
    assert code == 0, err
    assert "--steps 4 -> 8: the cosine schedule is stretched over the new length, so the " \
           "learning rate of step 5 (the first resumed) goes 0.0003 -> 0.00165 (step 4 ran at " \
           "0.000695)" in err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 9))
    assert not (run / "trace.json").exists()


def test_rank_0_says_it_builds_a_large_model_and_how_long_it_took(capsys):
    """A 7B model's units and state took minutes to build with nothing on the screen."""
    from ratrain.models.presets import get_preset
    from ratrain.schedule.plan import build_plan
    from ratrain.training.run import _building

    big, tiny = RunConfig(model=get_preset("llama2-7b")), RunConfig(model=get_preset("tiny"))
    for cfg, rank, progress in ((tiny, 0, True), (big, 1, True), (big, 0, False)):
        _building(cfg, None, rank, progress)()
    assert capsys.readouterr().err == ""
    _building(big, build_plan(32, 2, 1, 2), 0, True)()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "building llama2-7b (6.74B parameters; this rank: stage 0 of 2, units 0-16) ..."
    assert lines[1].startswith("built in ") and lines[1].endswith(" s") and len(lines) == 2


def test_cudas_allocator_grows_by_mapping_unless_the_user_chose(monkeypatch):
    """A plan sized to its budget failed on 4.6 GiB reserved in fixed segments but unused
    (llama2-7b on an H200, 2026-11-28): `ratrain` asks for expandable segments before CUDA
    starts, and leaves a setting the user made alone."""
    import os
    import sys

    from ratrain.cli import main

    for given, expected in ((None, "expandable_segments:True"),
                            ("max_split_size_mb:128", "max_split_size_mb:128")):
        if given is None:
            monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
        else:
            monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", given)
        monkeypatch.setattr(sys, "argv", ["ratrain", "--help"])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 0
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == expected


@pytest.mark.parametrize("flags", [("--micro-batch-group", "2", "--schedule", "1f1b"),
                                   ("--update", "carried")])
def test_a_plain_runs_lifecycle_flags_take_the_executor(monkeypatch, capsys, tmp_path, flags):
    """One process in fp32 ran on the plain engine whatever --micro-batch-group or --update
    said (its order: 1F1B, updates inline): the flags did nothing and nothing said so. On the
    executor the run keeps a ledger, and its losses are the plain run's."""
    cfg = str(small_config(tmp_path, steps=3, checkpoints=False))
    losses = {}
    for name, extra in (("plain", ()), ("flags", flags)):
        code, _, err = run_cli(monkeypatch, capsys, "train", "--config", cfg, "--run-dir",
                               str(tmp_path / name), "--no-progress", "--no-report", *extra)
        assert code == 0, err
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        losses[name] = [r["loss"] for r in rows]
        assert (rows[-1].get("ledger_peak_bytes_per_rank") is not None) == (name == "flags")
    assert losses["flags"] == pytest.approx(losses["plain"], rel=1e-5)
