"""One rule of what can run (setup/rule.py): the planner returns only what training runs, the
CLI and the setup stage refuse what the rule refuses, in one line; a plan is built (or read)
once."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from ratrain.config import RunConfig
from ratrain.data.corpus import stdlib_files
from ratrain.errors import UserError
from ratrain.models.presets import get_preset
from ratrain.planner import plan_file, search
from ratrain.setup import Machine, run_plan
from ratrain.setup import rule as runnable
from ratrain.sim.profile import PRESET_DIR, load_profile

from .cli_runner import run_cli

OK = dict(n_layers=4, pp=2, dp=2, global_batch=16, micro_batch_size=2)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def _small(tmp_path) -> RunConfig:
    """A model and corpus small enough that a step in this process takes a moment."""
    data = tmp_path / "text"
    data.mkdir(exist_ok=True)
    shutil.copy(next(f for f in stdlib_files() if f.name == "textwrap.py"), data)
    return RunConfig.from_dict({
        "model": {"name": "small", "vocab_size": 257, "dim": 32, "n_layers": 2, "n_heads": 2,
                  "ffn_dim": 64, "max_seq_len": 64},
        "data": {"path": str(data)},
        "train": {"seq_len": 16, "global_batch": 8, "micro_batch_size": 2, "steps": 1,
                  "eval_batches": 0}})


def _small_file(tmp_path) -> str:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(_small(tmp_path).to_dict()))
    return str(path)


@pytest.mark.parametrize("change, needle", [
    (dict(world=3), "torchrun started 3 processes, but --pp 2 x --dp 2 needs 4"),
    (dict(pp=7), "pp=7 is more stages than the model has units (6"),
    (dict(global_batch=12, micro_batch_size=4), "global batch 12 does not split into dp=2"),
    (dict(global_batch=4), "n_micro=1 is fewer than pp=2 stages: 1F1B needs"),
    (dict(tie_embeddings=True, shard_state=True, view_window=0),
     "tied embeddings across pipeline stages sum the whole tied weight's gradient"),
    (dict(tie_embeddings=True, sync="diloco:4:2"), "--sync diloco:4:2 cuts apart"),
    (dict(tie_embeddings=True, state_home="host", host_is_separate=True, dp=1, global_batch=8),
     "tied embeddings across pipeline stages with --state-home host on GPUs"),
    (dict(shard_state=True, dp=1, global_batch=8, view_window=0), "--dp 1 has none to split over"),
    (dict(shard_state=True, state_home="host", view_window=0), "cannot be combined with --state-home host"),
    (dict(shard_state=True), "sharded state needs compute views"),
    (dict(state_home="host", host_is_separate=True, view_window=1, micro_batch_group=1),
     "NCCL cannot reduce host memory"),
    (dict(state_home="host", host_is_separate=True, view_window=1, device_grad_sum=False),
     "which NCCL cannot do"),
    (dict(state_home="host", view_window=1, device_grad_sum=True, policy="baseline"),
     "lifecycle choice of --policy ratrain"),
    (dict(state_home="device", device_grad_sum=True), "for whole state in host memory"),
    (dict(policy="baseline", view_window=1), "--view-window needs --policy ratrain"),
    (dict(dtype="float16", clip=False), "float16 needs the global gradient norm"),
])
def test_each_refusal_is_one_line(change, needle):
    reason = runnable.refusal(**{**OK, **change})
    assert reason and needle in reason and "\n" not in reason
    assert not runnable.runnable(**{**OK, **change})
    with pytest.raises(UserError, match="^" + re.escape(reason) + "$"):
        runnable.check_runnable(**{**OK, **change})


def test_what_can_run_is_not_refused():
    def can(**change) -> bool:
        return runnable.runnable(**{**OK, **change})

    assert runnable.refusal(**OK) is None
    assert can(state_home="host")  # a CPU: the host is the device's memory
    assert can(state_home="host", host_is_separate=True, dp=1, global_batch=8)
    assert can(shard_state=True, view_window=1, host_is_separate=True)
    assert can(policy="baseline", view_window=0, dtype="float16")
    assert can(world=4)
    assert can(tie_embeddings=True, pp=1, dp=4, view_window=1, state_home="host")
    assert can(tie_embeddings=True, view_window=1, state_home="host")  # across the 2 stages
    # host state over replicas on GPUs: DiLoCo's outer sync runs over gloo; NCCL's sum every
    # step is of each unit's gradient on the GPU, once a step: the 4 micro-batches in one group
    for sync in ("diloco:4", "diloco:4:2:bf16"):
        assert can(state_home="host", host_is_separate=True, sync=sync)
    assert can(state_home="host", host_is_separate=True, view_window=1, micro_batch_group=4)
    assert can(state_home="host", host_is_separate=True, view_window=1)  # (group: to choose)
    assert not can(state_home="host", host_is_separate=True, view_window=1, micro_batch_group=2)


PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
MODELS = ("llama2-7b", "baichuan2-13b", "qwen2.5-32b", "llama2-70b")
# Searches small enough to complete in seconds, that find plans for some of the four models on
# each preset (on this CPU's 8 GB only llama2-7b fits, one unit a stage). mt3000's llama2-7b
# takes ~15 s alone on 2 cores and took its 60 s limit beside other work, which left the
# search incomplete and failed the test: the limit is 600 s, not a measure of speed. Its
# search is held to the 8-stage pipelines its best plans are (over every degree, 2026-12-03:
# pp 8 for llama2-7b, none for the others), which halves it.
SIZES = {"cpu-local": dict(devices=34, dtype="float32", pipeline_degrees=(34,)),
         "mt3000": dict(devices=8, dtype="float16", pipeline_degrees=(8,))}


def _runs_as_trained(candidate, request) -> None:
    """What `ratrain train --plan FILE` does with the plan file of `candidate`: the plan checked
    against its run settings, then by the rule on the profile's kind of device; and the same
    settings given as flags pass the rule too."""
    cfg = RunConfig(model=request.model)
    cfg.train.seq_len, cfg.train.global_batch = request.seq_len, request.global_batch
    cfg.train.dtype = request.dtype
    data = json.loads(json.dumps(plan_file.to_dict(candidate, cfg, request)))
    run = RunConfig.from_dict(data["run"])
    run.parallel.plan_file = "plan.json"
    machine = Machine.of_profile(request.profile, run)
    run_plan(run, machine, plan_data=data)
    run.parallel.plan_file = None
    run_plan(run, machine)


def test_every_plan_the_search_returns_can_run():
    """The four models on every preset profile, at sizes small enough to search in seconds: whatever the search returns, training would run; on the GPU profiles some
    plans keep their state on the host, and those over replicas sum it on the GPUs."""
    found = {}
    for name in PRESETS:
        profile = load_profile(name)
        size = SIZES.get(name, dict(devices=2, dtype="bfloat16"))
        for model in MODELS:
            request = search.PlanRequest(
                model=get_preset(model), profile=profile, global_batch=size["devices"],
                seq_len=64, top=1, micro_batch_sizes=(1,), time_limit_s=600, **size)
            result = search.search(request)
            assert result.complete
            for c in result.best:
                _runs_as_trained(c, request)
                found.setdefault(name, []).append(c)
    assert set(found) == set(PRESETS), sorted(found)
    on_gpus = [c for name in ("a100-40g-10gbe", "h100-80g-ib") for c in found[name]]
    assert any(c.layout.lifecycle.state_home == "host" for c in on_gpus)
    for c in on_gpus:
        host_over_replicas = c.layout.lifecycle.state_home == "host" and c.layout.dp > 1
        assert c.plan.device_grad_sum == host_over_replicas


def test_mt3000_keeps_state_on_the_host_over_replicas():
    """Its collectives reach the host tier (profile: host_collectives), so nothing refuses it."""
    request = search.PlanRequest(model=get_preset("tiny"), profile=load_profile("mt3000"),
                                 devices=4, global_batch=8, seq_len=256, dtype="float16",
                                 budget=40e6, top=5)
    refused: list[str] = []
    laid_out = search.layouts(request, refused)
    assert any(lay.lifecycle.state_home == "host" and lay.dp > 1 for lay in laid_out)
    assert not any("NCCL cannot do" in reason for reason in refused)


@pytest.mark.parametrize("profile", ["h100-80g-ib", "a100-40g-10gbe"])
def test_the_search_lays_out_state_on_the_host_over_replicas_in_one_group_where_nccl_syncs(
        profile):
    """NCCL sums host-homed gradients on the GPUs once a step: such layouts are one stage whose
    micro-batches run in one group (or one micro-batch a replica); a pipeline of several is
    refused with the line training gives."""
    request = search.PlanRequest(model=get_preset("tiny"), profile=load_profile(profile),
                                 devices=4, global_batch=8, seq_len=256, dtype="float16",
                                 budget=40e6, top=5)
    refused: list[str] = []
    laid_out = search.layouts(request, refused)
    spanning = [lay for lay in laid_out if lay.lifecycle.state_home == "host" and lay.dp > 1]
    assert spanning
    assert all(lay.lifecycle.micro_batch_group == lay.n_micro for lay in spanning)
    assert any(lay.n_micro > 1 for lay in spanning)
    assert any("NCCL cannot reduce host memory" in reason for reason in refused)
    best = search.search(request).best
    assert len(best) == 5
    for c in best:
        _runs_as_trained(c, request)
        summed = c.plan.device_grad_sum
        assert summed == (c.layout.lifecycle.state_home == "host" and c.layout.dp > 1)
        assert ("summed on device" in c.layout.lifecycle.label(0, summed)) == summed


def test_simulate_refuses_what_could_not_run_on_the_profile(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--dp", "2", "--global-batch", "16",
                           "--state-home", "host", "--profile", "h100-80g-ib", "--schedule",
                           "1f1b")
    assert code == 2 and "NCCL cannot reduce host memory" in err
    assert "--micro-batch-group 4" in err and len(err.strip().splitlines()) == 1
    # --schedule auto takes the one group that runs
    code, out, err = run_cli(monkeypatch, capsys, "simulate", "--dp", "2", "--global-batch",
                             "16", "--state-home", "host", "--profile", "h100-80g-ib")
    assert code == 0 and "groups of 4" in err + out, err
    assert "(the only candidate that can run here)" in err + out
    # made on this CPU (the host is the device's memory), the plan runs here, not on GPUs
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--dp", "2", "--global-batch", "16",
                           "--state-home", "host", "--out", "p.json")
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", "p.json", "--global-batch",
                           "16", "--profile", "cpu-local", "--json")
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--plan", "p.json", "--global-batch",
                           "16", "--profile", "h100-80g-ib")
    assert code == 2 and "which NCCL cannot do" in err


def test_a_search_nothing_can_run_in_says_why(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--profile", "cpu-local", "--devices", "4",
                           "--pp", "4", "--global-batch", "4", "--micro-batch-size", "2")
    assert code == 2
    # (until 2026-12-02 "no layout on 4 devices can run: ... raise global_batch or lower
    # micro_batch_size/dp", though only the pinned --pp could be lowered)
    assert err.strip() == ("error: --pp 4 needs at least 4 micro-batches a step (one a stage); "
                           "--global-batch 4 gives at most 2 (micro-batches of 2 sequences): "
                           "raise --global-batch to 8 or lower --pp")


@pytest.mark.parametrize("args, needle", [
    (["--shard-state"], "--dp 1 has none to split over"),
    (["--shard-state", "--dp", "2", "--global-batch", "16", "--state-home", "host"],
     "cannot be combined with --state-home host"),
])
def test_train_refuses_what_the_rule_refuses(monkeypatch, capsys, tmp_path, args, needle):
    code, _, err = run_cli(monkeypatch, capsys, "train", "--no-progress", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_prepare_checks_the_plan_a_file_holds_not_only_the_flags(monkeypatch, capsys, tmp_path):
    """A plan file without run settings, state on the host over 2 replicas, on GPUs: the
    config says state on the device, the plan says host; the plan is what would run."""
    from ratrain.training import prepare

    assert run_cli(monkeypatch, capsys, "plan", "--config", _small_file(tmp_path), "--dp", "2",
                   "--state-home", "host", "--out", "p.json")[0] == 0
    cfg = _small(tmp_path)
    cfg.parallel.dp, cfg.parallel.plan_file = 2, str(tmp_path / "p.json")
    assert prepare.prepare(cfg, progress=False)[0].state_home == "host"  # on this CPU it runs
    monkeypatch.setattr(prepare, "this_machine", lambda cfg: Machine(host_is_separate=True))
    with pytest.raises(UserError, match="which NCCL cannot do"):
        prepare.prepare(cfg, progress=False)


def test_a_plan_is_built_once_and_a_plan_file_read_once(monkeypatch, capsys, tmp_path):
    """The setup stage builds the plan (or reads the plan file) and the ranks get it: a rank
    that made its own would build again, or read the file again."""
    from ratrain.setup import plan_file as setup_plan_file
    from ratrain.setup import entry as setup_entry
    from ratrain.training import run as train

    built, read, ranks = [], [], []
    build = setup_entry.build_plan
    monkeypatch.setattr(setup_entry, "build_plan",
                        lambda *a, **k: built.append(1) or build(*a, **k))
    read_file = setup_plan_file.read_plan_file
    monkeypatch.setattr(setup_plan_file, "read_plan_file",
                        lambda *a: read.append(1) or read_file(*a))
    monkeypatch.setattr("ratrain.cli.plan_taken.read_plan_file", setup_plan_file.read_plan_file)
    common = ("--config", _small_file(tmp_path), "--no-progress", "--no-trace")
    real_rank_main = train.rank_main
    monkeypatch.setattr(train, "rank_main", lambda *args, **kwargs: ranks.append(args) or False)
    code, _, err = run_cli(monkeypatch, capsys, "train", "--activation", "recompute",
                           "--run-dir", "a", *common)
    assert code == 0, err
    assert len(built) == 1 and ranks[0][5] == json.loads((tmp_path / "a" / "plan.json").read_text())
    assert run_cli(monkeypatch, capsys, "plan", "--config", _small_file(tmp_path), "--activation",
                   "recompute", "--out", "p.json")[0] == 0
    built.clear()
    code, _, err = run_cli(monkeypatch, capsys, "train", "--plan", "p.json", "--run-dir", "b",
                           *common)
    assert code == 0, err
    assert len(read) == 1 and not built
    # (less the settings it was made for, which the run took from it: cli/plan_taken.use_plan)
    handed = {k: v for k, v in json.loads((tmp_path / "p.json").read_text()).items()
              if k not in ("run", "model_preset")}
    assert ranks[1][5] == handed  # (plan_dict: rank_main's sixth)
    # a rank handed the plan makes none of its own: its engine gets the one handed to it
    class Handed(Exception):
        pass

    def engine(cfg, plan, *args, **kwargs):
        raise Handed(plan)

    monkeypatch.setattr(train, "plan_here", lambda *a: pytest.fail("the rank made a plan"))
    monkeypatch.setattr(train, "PipelineEngine", engine)
    with pytest.raises(Handed) as handed:
        real_rank_main(*ranks[1])
    assert handed.value.args[0].to_dict() == ranks[1][5]


@pytest.mark.parametrize("pp, threads_per_rank, expected",
                         [(1, None, 3), (1, 2, 2), (2, None, 2), (2, 1, 1)])
def test_this_machine_says_the_threads_its_ranks_compute_on(monkeypatch, pp, threads_per_rank,
                                                            expected):
    """A run in this process computes on --threads, else this process's (torch's default:
    every core); the ranks launched for a pipeline split the cores, or take --threads."""
    import torch

    from ratrain.training import prepare

    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr("ratrain.training.prepare.usable_cores", lambda: 4)
    cfg = RunConfig()
    cfg.parallel.pp, cfg.parallel.threads_per_rank = pp, threads_per_rank
    assert prepare.this_machine(cfg).threads_per_rank == expected
