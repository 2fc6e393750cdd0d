"""The run-config flags shared by train, plan and simulate, and the config they build."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import click

from ratrain.cli.state_options import STATE_FIELDS, STATE_OPTIONS
from ratrain.config import AUTO_SCHEDULE, RunConfig
from ratrain.errors import UserError
from ratrain.schedule.outer_sync import parse_sync
from ratrain.training.resume_settings import fixed_on_resume, same_setting
from ratrain.training.run_config import run_config
from ratrain.training.run_tokenizer import kept_tokenizer
from ratrain.schedule.plan import SCHEDULES
from ratrain.schedule.weight_grads import parse_placement


def resolve_model(spec: str, cfg: RunConfig, tokenizer: str | None = None) -> None:
    """A preset name, or a Hugging Face model directory (its weights become the starting point,
    checked here, before any process starts). `tokenizer`: the --tokenizer given, if any."""
    from ratrain.models.presets import PRESETS, get_preset

    path = Path(spec)
    cfg.train.init_from = None  # --model decides the weights, not a --config's leftover
    if spec in PRESETS and path.is_dir():  # the directory replaced the preset, unsaid
        raise UserError(f"--model {spec} is both a preset and a directory here: --model "
                        f"./{spec} for the directory")
    if path.is_dir():
        from ratrain.models.hf import config_from_hf
        from ratrain.models.hf_files import check_weights, unused_line
        from ratrain.models.hf_start import random_weights_note, unread_weights

        cfg.model = config_from_hf(path)
        ctx = click.get_current_context(silent=True)  # (plan and simulate read no tokenizer)
        if (tokenizer is None and cfg.data.tokenizer == "byte" and (ctx is None or ctx.info_name
                                                                    == "train")
                and (path / "tokenizer.json").is_file()):
            click.echo(f"warning: --model {spec}: its tokenizer.json is not used (the byte "
                       f"tokenizer is); --tokenizer {path / 'tokenizer.json'} uses it", err=True)
        unused = check_weights(path, cfg.model)
        if unused is not None:
            cfg.train.init_from = str(path.resolve())  # (a resume may start elsewhere)
            if unused:
                click.echo(f"warning: --model {spec}: {unused_line(unused)}", err=True)
        elif any(path.glob("*.bin")):  # trained from random weights, silently, until 2026-11-29
            raise UserError(f"--model {spec}: its weights are PyTorch .bin files, which ratrain "
                            "does not read (they are pickles); save them as safetensors "
                            "(transformers: save_pretrained(dir, safe_serialization=True)), or "
                            "give a directory with config.json alone to start from random weights")
        elif unread := unread_weights(path):
            raise UserError(f"--model {spec}: its weights ({', '.join(unread[:3])}) are of a "
                            "kind ratrain does not read (it reads safetensors); save them as "
                            "safetensors, or give a directory with config.json alone to start "
                            "from random weights")
        else:
            click.echo(random_weights_note(path), err=True)
    elif spec not in PRESETS and (path.exists() or "/" in spec):
        raise UserError(f"--model {spec}: " + ("a file; a Hugging Face model is a directory "
                        "(config.json and its safetensors)" if path.exists() else
                        "no such directory (a Hugging Face model directory, or a preset: "
                        "`ratrain models`)"))
    else:
        cfg.model = get_preset(spec)


def _placement(ctx, param, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_placement(value)
        except UserError as e:
            raise click.BadParameter(str(e)) from None
    return value


_CONFIG_OPTIONS = [
    click.option("--model", help="Preset name (see `ratrain models`) or a Hugging Face model directory.  [default: tiny]"),
    click.option("--data", type=click.Path(), help="Text file, directory of text files, or pre-tokenized .bin.  [default: Python's standard library]"),
    click.option("--tokenizer", help="'byte' or a tokenizer.json (or a directory holding one).  [default: byte]"),
    click.option("--config", "config_file", type=click.Path(), help="YAML or JSON run config; flags override it."),
    click.option("--steps", type=int, help="Optimizer steps.  [default: 300]"),
    click.option("--seed", type=int, help="Seed of the initial weights and the data order.  [default: 0]"),
    click.option("--seq-len", type=int, help="Tokens per sequence.  [default: 256]"),
    click.option("--global-batch", type=int, help="Sequences per optimizer step (independent of --pp/--dp).  [default: 8]"),
    click.option("--micro-batch-size", type=int, help="Sequences per micro-batch.  [default: 2, or a replica's share of the global batch where that is smaller; a search picks its own]"),
    click.option("--lr", type=float, help="Peak learning rate.  [default: 3e-3]"),
    click.option("--warmup-steps", type=int, help="Steps over which the lr rises linearly to --lr, before its cosine decay; 0: none. A run of fewer steps never reaches --lr (said at its start, with --progress).  [default: 30]"),
    click.option("--grad-clip", type=float, help="Clip the global gradient norm to this; 0: no clipping.  [default: 1.0]"),
    click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Compute dtype of the parameter views and activations; masters stay fp32 (float16 with dynamic loss scaling).  [default: float32]"),
    click.option("--pp", type=int, help="Pipeline stages.  [default: 1]"),
    click.option("--dp", type=int, help="Data-parallel replicas.  [default: 1]"),
    click.option("--policy", type=click.Choice(["ratrain", "baseline"]), help="ratrain: each unit's gradient sync starts after its last backward and runs under the rest, then its update; baseline: GPU-style, every sync and update after the pipeline flush.  [default: ratrain]"),
    click.option("--rank-order", type=click.Choice(["pp-dp", "dp-pp"]), help="pp-dp: a stage's replicas are neighbouring ranks (share a node); dp-pp: a replica's stages are.  [default: pp-dp]"),
    click.option("--schedule", type=click.Choice([AUTO_SCHEDULE, *SCHEDULES]), help="The order of forwards and backwards: 1f1b, gpipe, or zbh1 (zero-bubble ZB-H1: each backward split into the input gradient and the weight gradient, the latter placed by --weight-grad); auto: the fastest of 1f1b and zbh1's placements whose memory fits, by simulating this run's plans on --profile (default: cpu-local on a CPU, the GPU family's preset on a GPU), said at the start of the run.  [default: auto]"),
    click.option("--weight-grad", callback=_placement, metavar="[bubble|bubble:K|grouped]", help="Where a split schedule (zbh1) runs the weight gradients: bubble (in the pipeline's cool-down), bubble:K (the same, but no stage defers more than K micro-batches' weight gradients: less memory on the later stages, less of the bubble filled; 0 holds about what 1F1B holds) or grouped (per unit, all micro-batches together, so each unit's gradient is final early and its sync hides under the rest; keeps every micro-batch's activations until then; on one stage, the whole backward unit-major).  [default: bubble]"),
    click.option("--micro-batch-group", type=int, help="Run a stage's micro-batches in groups of this many, each group through the stage unit by unit (forwards, then recomputes and backwards), 1F1B over the groups: each unit's view is made and its gradient folded about m/g times a step instead of 2m and m, for g times the activations in flight. Must divide the micro-batches per step; 1 is 1F1B. With --schedule auto, chosen by simulation where the plan has views.  [default: 1, or chosen]"),
    click.option("--activation", help="What decoder blocks keep for the backward: keep (everything), recompute (only the input; the forward re-runs before the backward) or offload (saved tensors go to host memory and come back before the backward). One for every stage, or one per stage: recompute,keep.  [default: keep]"),
    *STATE_OPTIONS,
    click.option("--sync", metavar="[step|diloco:H[:F][:bf16][:islands=K]]", help="How the data-parallel replicas agree. step: every gradient summed every step. diloco:H changes the ALGORITHM, not only the schedule (DiLoCo): each replica takes H steps with its own AdamW and only its own gradients (its own clipping, its own loss), then per unit the replicas' mean change is taken as the outer gradient of a Nesterov SGD step (--outer-lr, --outer-momentum) and every replica continues from the result: about H times less traffic, for links too slow for a sync every step. diloco:H:F (Streaming DiLoCo): F fragments of the model sync in turn over the H steps, each overlapped with the next step and mixed into the local weights (--outer-mix). :bf16 sends the deltas in bfloat16. :islands=K (for sites of several devices joined by a slow link): K islands of dp/K neighbouring replicas, each synchronous inside (its gradients summed every step), are DiLoCo's workers, and each island sends one delta across, sliced over its replicas; with --shard-state each island's state is sharded over its replicas. Needs --dp >= 2 and --policy ratrain; --shard-state only with islands.  [default: step]"),
    click.option("--outer-lr", type=float, help="--sync diloco: the outer Nesterov step's learning rate.  [default: 0.7]"),
    click.option("--outer-momentum", type=float, help="--sync diloco: the outer Nesterov momentum.  [default: 0.9]"),
    click.option("--outer-mix", type=float, help="--sync diloco:H:F: the share of its local weights a replica keeps when a fragment's outer result arrives (one step late).  [default: 0.5]"),
    click.option("--update", type=click.Choice(["auto", "inline", "carried"]), help="Where each unit's AdamW update runs: inline (in the step's program, after its gradient is final: after the global norm when clipping) or carried (started on a host thread of its own as soon as its gradient is final, and waited in the next step right before the unit's weights are read again, so it runs beside the compute; same math). auto: carried where the state lives in a GPU's host memory (--state-home host), else inline.  [default: auto]"),
    click.option("--partition", help="Units per stage, comma-separated (embedding and head count as units); an empty string splits them evenly (a resumed run's in place). A resume at another --pp splits evenly unless given.  [default: even]"),
    click.option("--threads", type=int, help="CPU threads per rank (default: a single process keeps OMP_NUM_THREADS or every core; ranks that share a machine, launched by ratrain or torchrun, split its cores, unless OMP_NUM_THREADS is set to more than 1)."),
    click.option("--eval-every", type=int, help="Steps between validations (and one at the end); 0: only at the end.  [default: 100]"),
    click.option("--eval-batches", type=int, help="Global batches of the held-out sequences (their first) each validation runs; 0: no validation. A resume may change it.  [default: 4]"),
    click.option("--val-fraction", type=float, help="The share of the data's token stream (its end) held out for validation, in [0, 1). It sets the split, so a resume cannot change it.  [default: 0.05]"),
    click.option("--checkpoint-every", type=int, help="Steps between checkpoints (0: only the last).  [default: 100]"),
]

_FIELDS = {"steps": "train", "seed": "train", "seq_len": "train", "global_batch": "train",
           "micro_batch_size": "train", "lr": "train", "warmup_steps": "train",
           "grad_clip": "train", "dtype": "train", "eval_every": "train",
           "eval_batches": "train", "val_fraction": "data",
           "checkpoint_every": "train", "pp": "parallel", "dp": "parallel", "policy": "parallel",
           "schedule": "parallel", "weight_grad": "parallel", "activation": "parallel",
           "micro_batch_group": "parallel", "tokenizer": "data", "data": "data",
           "threads": "parallel", "rank_order": "parallel", "sync": "parallel",
           "outer_lr": "train", "outer_momentum": "train", "outer_mix": "train",
           "update": "parallel", **STATE_FIELDS}
_RENAMED = {"data": "path", "threads": "threads_per_rank"}
# Flags that change the math or the data, which a resume may not change (the model's, and
# training/resume_settings.py's fixed fields). (A --config given again is the run's when the
# config it gives is: train_resume.check_same_run.)
_FIXED_ON_RESUME = ["model"] + [k for k, section in _FIELDS.items()
                                if fixed_on_resume(section, _RENAMED.get(k, k))]


def config_options(fn):
    for option in reversed(_CONFIG_OPTIONS):
        fn = option(fn)
    return fn


def build_config(opts: dict, resume_dir: str | None = None) -> RunConfig:
    """The run config: a resumed run's, a --config file's or the default, then the flags given."""
    if resume_dir:
        cfg = run_config(resume_dir, f"--resume {resume_dir}")
        # a flag repeating the run's own value is no change (a job's command line, repeated)
        saved = {k: getattr(getattr(cfg, _FIELDS[k]), _RENAMED.get(k, k)) for k in _FIXED_ON_RESUME
                 if k in _FIELDS}
        saved["model"] = cfg.model.name  # a preset's name
        given = Path(opts.get("model") or "")
        if opts.get("model") and given.is_dir() and (
                given.resolve() == Path(cfg.train.init_from).resolve() if cfg.train.init_from
                else _same_model(given, cfg.model)):
            saved["model"] = opts["model"]  # the Hugging Face directory it started from
        copy = kept_tokenizer(resume_dir)
        changed = [k for k in _FIXED_ON_RESUME
                   if opts.get(k) is not None and not _same_flag(k, saved[k], opts[k], copy)]
        if changed:
            names = ", ".join(f"--{k.replace('_', '-')} ({_spelled(k, saved[k])} -> {opts[k]})"
                              for k in changed)
            raise UserError(f"cannot change {names} when resuming; start a new run instead")
    elif opts["config_file"]:
        cfg = RunConfig.load(opts["config_file"])
    else:
        from ratrain.models.presets import get_preset

        cfg = RunConfig(model=get_preset("tiny"))
    if opts["model"] and not resume_dir:  # (resumed: the run's own, checked above)
        resolve_model(opts["model"], cfg, opts.get("tokenizer"))
    for key, section in _FIELDS.items():
        if opts[key] is not None:
            cfg.take_flag("--" + key.replace("_", "-"), section, _RENAMED.get(key, key), opts[key])
    if resume_dir and opts.get("shard_state") is False:  # what only sharded state has goes too
        if opts.get("shard_group") is None:
            cfg.parallel.shard_group = None
        if opts.get("grad_lifetime") is None:
            cfg.parallel.grad_lifetime = "step"
    if resume_dir and opts["partition"] is None and cfg.parallel.partition is not None and len(
            cfg.parallel.partition) != cfg.parallel.pp:  # made for the run's other --pp
        if int(os.environ.get("RANK", 0)) == 0:
            print(f"note: the resumed run's --partition {','.join(map(str, cfg.parallel.partition))} "
                  f"was for its {len(cfg.parallel.partition)} stages; at --pp {cfg.parallel.pp} "
                  "the units are split evenly (--partition sets them)", file=sys.stderr)
        cfg.parallel.partition = None
    if opts["partition"] == "":  # the default's even split, in place of a resumed run's
        cfg.parallel.partition = None
    elif opts["partition"]:
        try:
            cfg.parallel.partition = [int(x) for x in opts["partition"].split(",")]
        except ValueError:
            raise UserError(f"--partition must be comma-separated integers, got {opts['partition']!r}") from None
    _fit_micro_batch(cfg, opts)
    return cfg


def _same_model(path: Path, model) -> bool:
    """Whether a --model directory of config.json alone (a run from random weights, which
    records no train.init_from) is a resumed run's `model`: until 2026-12-04 `--model ./tiny`
    given again was refused as a change from the model's name, tiny."""
    import dataclasses

    from ratrain.models.hf import config_from_hf

    return dataclasses.replace(config_from_hf(path, warn=lambda line: None),
                               name=model.name) == model


def _same_flag(key: str, saved, given, run_copy: str | None) -> bool:
    """A flag repeating a resumed run's value: --data and --tokenizer by the file they name
    (data.txt and /here/data.txt are one; until 2026-11-30 the absolute spelling was refused
    as a change, and a relative one named another file from another directory); --tokenizer
    also by the bytes of the run's copy of it (`run_copy`)."""
    return same_setting((_FIELDS.get(key, ""), _RENAMED.get(key, key)), saved, given, run_copy)


def _spelled(key: str, saved) -> str:
    """A saved relative path, with the file it names from here."""
    if key in ("data", "tokenizer") and isinstance(saved, str) and saved != "byte" and not Path(
            saved).expanduser().is_absolute():
        return f"{saved}, here {Path(saved).expanduser().absolute()}"
    return str(saved)


def _fit_micro_batch(cfg: RunConfig, opts: dict) -> None:
    """A micro-batch holds at most a replica's share of the global batch: where no
    --micro-batch-size says otherwise, `--global-batch 1` trains one sequence a step rather
    than being refused for the default micro-batch of 2."""
    t, dp = cfg.train, cfg.parallel.dp  # (ints: the flags' type, and the config's fields')
    if (opts.get("micro_batch_size") is None and dp >= 1 and t.global_batch % dp == 0
            and 1 <= t.global_batch // dp < t.micro_batch_size):
        t.micro_batch_size = t.global_batch // dp


def refuse_idle_outer_flags(cfg: RunConfig, opts: dict) -> None:
    """--outer-lr, --outer-momentum and --outer-mix, typed for a run whose --sync (final once a
    plan file or the resumed run has set it) has no outer step or no fragments, would do
    nothing. Only typed flags: a resumed DiLoCo run's config keeps its outer values under
    --sync step."""
    outer = parse_sync(cfg.parallel.sync)
    for key in ("outer_lr", "outer_momentum", "outer_mix"):
        if opts.get(key) is None:
            continue
        flag = f"--{key.replace('_', '-')} {opts[key]}"
        if outer is None:
            raise UserError(f"{flag} is for the outer step of --sync diloco:H, which this run "
                            f"does not take: it syncs every step (--sync {cfg.parallel.sync}); "
                            f"add --sync diloco:H or leave the flag out")
        if key == "outer_mix" and not outer.streaming:
            raise UserError(f"{flag} mixes a fragment's outer result into the local weights, "
                            f"which needs fragments: --sync diloco:H:F (this run has --sync "
                            f"{cfg.parallel.sync})")


# The shared flags that only training reads: no plan, search or simulated step depends on them,
# and a plan file does not hold them (planner/plan_file.run_settings). In the flags' order.
TRAINING_ONLY = ("data", "tokenizer", "steps", "seed", "lr", "warmup_steps", "eval_every",
                 "eval_batches", "val_fraction", "checkpoint_every")


def refuse_training_flags(opts: dict, command: str, why: str, used: tuple = ()) -> None:
    """The TRAINING_ONLY flags typed for `ratrain COMMAND`, but for those it `used`, refused in
    one line naming them all, `why` said ({them}: "it" or "them"): until 2026-12-04 `plan` took
    `--steps 3 --lr 7` and dropped them, and `train --plan` trained 300 steps at the default
    lr. Only typed flags, as refuse_idle_outer_flags: a --config's training section is the
    run's to come."""
    typed = [f"--{key.replace('_', '-')} {_typed(opts[key])}" for key in TRAINING_ONLY
             if key not in used and opts.get(key) is not None]
    if typed:
        them = "it" if len(typed) == 1 else "them"
        raise UserError(f"`ratrain {command}` does not use {', '.join(typed)}: "
                        + why.format(them=them))


def _typed(value) -> str:
    """A flag's value as it was likely typed: --lr 7, not click's 7.0."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_of(section: str, key: str) -> str | None:
    """The flag that sets the config field `section`.`key` ("--data" for data.path); None for
    a field only a --config sets (train.weight_decay)."""
    for flag, its_section in _FIELDS.items():
        if its_section == section and _RENAMED.get(flag, flag) == key:
            return "--" + flag.replace("_", "-")
    return None


# A resumed run's lifecycle settings that a refusal may name, and how to set each otherwise.
_SET_OTHERWISE = {"shard_state": "--no-shard-state turns it off",
                  "grad_lifetime": "--grad-lifetime step turns it off",
                  "sync": "--sync step turns it off",
                  "activation": "--activation with one policy, or one per stage, replaces it"}


def blame_the_resumed_run(error: UserError, run_dir: Path, opts: dict) -> None:
    """Add to `error` (a refusal of a resumed run's settings) where it names a setting that came
    from the run's config.yaml, not from a flag typed now: the rules word refusals in flags,
    and this user typed none of these."""
    saved, default = RunConfig.load(run_dir / "config.yaml").parallel, RunConfig().parallel
    for key, otherwise in _SET_OTHERWISE.items():
        flag = "--" + key.replace("_", "-")
        if (opts.get(key) is None and getattr(saved, key) != getattr(default, key)
                and re.search(re.escape(flag) + r"(?![\w-])", str(error))):
            error.args = (f"{error} ({flag} comes from the resumed run, {run_dir}/config.yaml; "
                          f"{otherwise})",)
            return
