"""Tied embeddings across pipeline stages: the head's stage keeps a copy of the embedding's
weight and TS sums the two copies' gradients, so every layout computes the one-process tied run
(within fp32's 1e-5: the tied gradient is summed in another order), the copies stay equal bit
for bit, and a checkpoint resumes under another --pp."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.distributed as dist

from ratrain import checkpoint
from ratrain.models.llama import build_unit
from ratrain.runtime.engine import PipelineEngine
from ratrain.runtime.launch import launch_local
from ratrain.runtime.process_groups import init_groups
from ratrain.schedule.grid import RankGrid
from ratrain.schedule.plan import build_plan
from ratrain.training.metrics import read_metrics
from ratrain.training.run import rank_main, train

from .conftest import assert_final_weights_match, micro_config, one_thread

pytestmark = pytest.mark.dist

STEPS = 8


def _tied(corpus, steps: int = STEPS, clip: bool = True):
    cfg = micro_config(*corpus, steps=steps)
    cfg.model.tie_embeddings = True
    cfg.train.eval_every = 4
    if not clip:
        cfg.train.grad_clip = 0.0
    return cfg


@pytest.fixture(scope="module")
def references(corpus, tmp_path_factory):
    """The one-process tied run (the head reads the embedding's weight), with and without
    clipping, made when first asked for."""
    made = {}

    def reference(clip: bool):
        if clip not in made:
            run_dir = tmp_path_factory.mktemp(f"tied_reference_{clip}")
            with one_thread():
                rank_main(_tied(corpus, clip=clip), str(run_dir), False, False, False)
            made[clip] = run_dir
        return made[clip]
    return reference


def _losses(run_dir) -> dict:
    rows = read_metrics(run_dir / "metrics.jsonl")
    return {r["step"]: (r["loss"], r.get("val_loss"), r["grad_norm"]) for r in rows}


def _assert_same_run(run_dir, ref_dir, n_units):
    got, want = _losses(run_dir), _losses(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step, (loss, val, norm) in want.items():
        assert abs(got[step][0] - loss) / loss < 1e-5, (step, got[step], want[step])
        if got[step][2] is not None:  # without clipping a pipeline takes no norm
            assert abs(got[step][2] - norm) / norm < 1e-5, (step, got[step], want[step])
        if val is not None:
            assert abs(got[step][1] - val) / val < 1e-5, (step, got[step], want[step])
    assert want[STEPS][0] < want[1][0] - 0.3  # it trained
    units, _ = assert_final_weights_match(run_dir, ref_dir, n_units)
    assert "lm_head.weight" not in units[n_units - 1]["weights"]  # saved as one stage has it


@pytest.mark.parametrize("pp,dp,clip,policy,schedule", [
    (2, 1, True, "ratrain", "1f1b"), (2, 2, True, "ratrain", "1f1b"),
    (3, 1, False, "ratrain", "1f1b"), (2, 1, False, "baseline", "1f1b"),
    (2, 1, True, "ratrain", "zbh1")])
def test_tied_embeddings_across_stages_compute_the_one_stage_run(pp, dp, clip, policy, schedule,
                                                                 corpus, references, tmp_path):
    cfg = _tied(corpus, clip=clip)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.policy = pp, dp, policy
    cfg.parallel.schedule = schedule
    launch_local(pp * dp, rank_main, (cfg, str(tmp_path), False, False, False),
                 error_dir=tmp_path / "errors")
    plan = checkpoint.load_meta(checkpoint.latest(tmp_path))["plan"]
    assert plan["tie_embeddings"] and plan["programs"][0].split().count("TS0") == 1
    _assert_same_run(tmp_path, references(clip), cfg.model.n_units)


def test_carried_host_updates_with_a_window_keep_the_tie(corpus, references, tmp_path):
    """Views in a window, state on the host, updates carried to the host thread: SU of the
    head waits for its WTS, and the run is still the one-stage run."""
    cfg = _tied(corpus)
    cfg.parallel.pp = 2
    plan = build_plan(cfg.model.n_layers, 2, 1, cfg.n_micro, view_window=1, state_home="host",
                      update="carried", tie_embeddings=True)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    cfg.parallel.state_home, cfg.parallel.plan_file = "host", str(tmp_path / "plan.json")
    cfg.parallel.update = "carried"
    launch_local(2, rank_main, (cfg, str(tmp_path), False, False, False),
                 error_dir=tmp_path / "errors")
    _assert_same_run(tmp_path, references(True), cfg.model.n_units)


def _copies_after_steps(cfg, out: str) -> None:
    """A rank of pp=2: a few steps on fixed batches, then the last stage sends its copy of the
    tied weight to the first, which writes whether the two are equal."""
    torch.set_num_threads(1)
    plan = build_plan(cfg.model.n_layers, 2, 1, cfg.n_micro, tie_embeddings=True)
    groups = init_groups(RankGrid(2, 1), "gloo", 60.0, tied=True)
    engine = PipelineEngine(cfg, plan, groups)
    gen = torch.Generator().manual_seed(0)
    for step in range(4):
        tokens = torch.randint(0, cfg.model.vocab_size, (cfg.n_micro, cfg.train.micro_batch_size,
                                                         cfg.train.seq_len + 1), generator=gen)
        engine.train_step([(t[:, :-1], t[:, 1:]) for t in tokens], 1e-2, step)
    head = engine.stage.state.get(cfg.model.n_units - 1)
    if head is not None:
        assert head.tied_copy
        dist.send(head.masters[head.tied].detach().contiguous(), 0)
    else:
        mine = engine.stage.state[0].masters[0].detach()
        other = torch.empty_like(mine)
        dist.recv(other, 1)
        with open(out, "w") as f:
            start = build_unit(cfg.model, 0, cfg.train.seed).embed_tokens.weight.detach()
            json.dump({"equal": torch.equal(mine, other), "moved": not torch.equal(mine, start)}, f)
    dist.destroy_process_group()


def test_the_two_copies_stay_equal_bit_for_bit(corpus, tmp_path):
    cfg = _tied(corpus)
    cfg.parallel.pp = 2
    out = tmp_path / "copies.json"
    launch_local(2, _copies_after_steps, (cfg, str(out)), error_dir=tmp_path / "errors")
    assert json.loads(out.read_text()) == {"equal": True, "moved": True}


@pytest.mark.parametrize("first_pp,then_pp", [(2, 1), (1, 2)])
def test_a_tied_checkpoint_resumes_under_another_pipeline(first_pp, then_pp, corpus, tmp_path):
    """Saved as a one-stage model has it (the head without its copy); a head on its own stage
    makes its copy, with the AdamW state, from the embedding's files."""
    full = tmp_path / "full"
    cfg = _tied(corpus)
    cfg.parallel.pp = first_pp
    cfg.train.checkpoint_every = 4
    train(cfg, full, progress=False, trace=False)
    run = tmp_path / "run"
    shutil.copytree(full, run)
    shutil.rmtree(checkpoint.checkpoint_dir(run, STEPS))  # as if it had died after step 4
    cfg.parallel.pp = then_pp
    train(cfg, run, resume=True, progress=False, trace=False)
    want, got = _losses(full), _losses(run)
    for step in range(5, STEPS + 1):
        assert abs(got[step][0] - want[step][0]) / want[step][0] < 1e-5, (step, got, want)


def test_a_llama32_style_run_across_stages_exports_what_transformers_computes(corpus, tmp_path):
    """Tied embeddings and Llama 3's RoPE scaling (within the sequence here), trained on two
    stages and exported: transformers' own LlamaForCausalLM gives the logits ratrain's model
    gives from the same checkpoint."""
    from click.testing import CliRunner
    from transformers import AutoModelForCausalLM

    from ratrain.cli import cli
    from ratrain.models import LlamaModel, config_from_hf, load_hf_weights

    cfg = _tied(corpus, steps=2)
    cfg.model.rope_factor, cfg.model.rope_original_max_len = 8.0, 16
    cfg.parallel.pp = 2
    train(cfg, tmp_path / "run", progress=False, trace=False)
    result = CliRunner().invoke(cli, ["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    hf_cfg = config_from_hf(tmp_path / "hf")
    assert (hf_cfg.tie_embeddings, hf_cfg.rope_factor, hf_cfg.rope_original_max_len) == (True, 8.0, 16)
    ours = LlamaModel(hf_cfg)
    load_hf_weights(ours, hf_cfg, tmp_path / "hf")
    ref = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, cfg.model.vocab_size, (2, cfg.train.seq_len),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours.eval()(tokens) - ref(tokens).logits).abs().max() < 1e-4


def test_diloco_keeps_the_copies_one_weight(corpus, tmp_path):
    """--sync diloco:2 on 2 stages x 2 replicas: both copies take the same outer step, so the
    run is the single-process DiLoCo reference's (the tied model, one weight); resumed on one
    stage from the step-4 checkpoint (its outer state saved in the one-stage form), it
    continues that run."""
    from ratrain.training.diloco_reference import run_reference

    cfg = _tied(corpus)
    cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.sync = 2, 2, "diloco:2"
    cfg.train.eval_batches, cfg.train.checkpoint_every = 0, 4
    full = tmp_path / "full"
    train(cfg, full, progress=False, trace=False)
    with one_thread():
        ref = run_reference(cfg)
    got = [r["loss"] for r in read_metrics(full / "metrics.jsonl")]
    assert max(abs(a - b) / b for a, b in zip(got, ref.losses)) < 1e-5, (got, ref.losses)
    run = tmp_path / "run"
    shutil.copytree(full, run)
    shutil.rmtree(checkpoint.checkpoint_dir(run, STEPS))
    cfg.parallel.pp = 1
    train(cfg, run, resume=True, progress=False, trace=False)
    resumed = [r["loss"] for r in read_metrics(run / "metrics.jsonl")]
    assert max(abs(a - b) / b for a, b in zip(resumed[4:], got[4:])) < 1e-5, (resumed, got)
