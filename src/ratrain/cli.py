"""The `ratrain` command line.

Exit codes: 0 success, 2 a user's mistake (one clear line on stderr), 1 an internal failure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ratrain.config import RunConfig
from ratrain.errors import UserError


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _fmt_count(n: int) -> str:
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _table(rows: list[list], header: list[str]) -> str:
    """Plain-text table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def line(cells) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ratrain")
def cli() -> None:
    """ratrain: pipeline + data-parallel training of LLaMA-family models on small-memory,
    slow-link clusters.

    Run `ratrain train` with no arguments for the built-in default: a tiny model on the text of
    Python's standard library, about two minutes on two CPU cores.
    """


def resolve_model(spec: str, cfg: RunConfig) -> None:
    """A preset name, or a Hugging Face model directory (its weights become the starting point)."""
    from ratrain.models.presets import get_preset

    path = Path(spec)
    if path.is_dir():
        from ratrain.models.hf import config_from_hf

        cfg.model = config_from_hf(path)
        if any(path.glob("*.safetensors")):
            cfg.train.init_from = str(path)
    else:
        cfg.model = get_preset(spec)


# Flags that change the math or the data: not allowed to change when resuming a run.
_FIXED_ON_RESUME = ("model", "data", "tokenizer", "seq_len", "global_batch", "micro_batch_size",
                    "lr", "seed", "dtype", "config_file")

_CONFIG_OPTIONS = [
    click.option("--model", help="Preset name (see `ratrain models`) or a Hugging Face model directory.  [default: tiny]"),
    click.option("--data", type=click.Path(), help="Text file, directory of text files, or pre-tokenized .bin.  [default: Python's standard library]"),
    click.option("--tokenizer", help="'byte' or a tokenizer.json (or a directory holding one).  [default: byte]"),
    click.option("--config", "config_file", type=click.Path(), help="YAML or JSON run config; flags override it."),
    click.option("--steps", type=int, help="Optimizer steps."),
    click.option("--seed", type=int),
    click.option("--seq-len", type=int),
    click.option("--global-batch", type=int, help="Sequences per optimizer step (independent of --pp/--dp)."),
    click.option("--micro-batch-size", type=int),
    click.option("--lr", type=float, help="Peak learning rate."),
    click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), help="Compute dtype of the parameter views and activations; masters stay fp32 (float16 with dynamic loss scaling).  [default: float32]"),
    click.option("--pp", type=int, help="Pipeline stages."),
    click.option("--dp", type=int, help="Data-parallel replicas."),
    click.option("--policy", type=click.Choice(["ratrain", "baseline"]), help="ratrain: each unit's gradient sync starts after its last backward and runs under the rest, then its update; baseline: GPU-style, every sync and update after the pipeline flush.  [default: ratrain]"),
    click.option("--rank-order", type=click.Choice(["pp-dp", "dp-pp"]), help="pp-dp: a stage's replicas are neighbouring ranks (share a node); dp-pp: a replica's stages are.  [default: pp-dp]"),
    click.option("--schedule", type=click.Choice(["1f1b", "gpipe"])),
    click.option("--activation", help="What decoder blocks keep for the backward: keep (everything), recompute (only the input; the forward re-runs before the backward) or offload (saved tensors go to host memory and come back before the backward). One for every stage, or one per stage: recompute,keep.  [default: keep]"),
    click.option("--view-window", type=int, help="Make each unit's compute view from its master at most this many units ahead of its use and release it after; 0 keeps all views resident. Only where views differ from masters (--dtype other than float32, or --state-home host on a GPU).  [default: 0]"),
    click.option("--state-home", type=click.Choice(["device", "host"]), help="Where fp32 masters, gradients and optimizer state live; host is pinned CPU memory on a GPU (on a CPU-only run, the same memory).  [default: device]"),
    click.option("--partition", help="Units per stage, comma-separated (embedding and head count as units)."),
    click.option("--threads", type=int, help="CPU threads per rank."),
    click.option("--eval-every", type=int),
    click.option("--checkpoint-every", type=int),
]

_FIELDS = {"steps": "train", "seed": "train", "seq_len": "train", "global_batch": "train",
           "micro_batch_size": "train", "lr": "train", "dtype": "train", "eval_every": "train",
           "checkpoint_every": "train", "pp": "parallel", "dp": "parallel", "policy": "parallel",
           "schedule": "parallel", "activation": "parallel", "tokenizer": "data", "data": "data",
           "threads": "parallel", "rank_order": "parallel", "view_window": "parallel",
           "state_home": "parallel"}
_RENAMED = {"data": "path", "threads": "threads_per_rank"}


def config_options(fn):
    for option in reversed(_CONFIG_OPTIONS):
        fn = option(fn)
    return fn


def build_config(opts: dict, resume_dir: str | None = None) -> RunConfig:
    """The run config: a resumed run's, a --config file's or the default, then the flags given."""
    if resume_dir:
        given = [k for k in _FIXED_ON_RESUME if opts.get(k) is not None]
        if given:
            names = ", ".join("--" + g.removesuffix("_file").replace("_", "-") for g in given)
            raise UserError(f"cannot change {names} when resuming; start a new run instead")
        if not (Path(resume_dir) / "config.yaml").is_file():
            raise UserError(f"{resume_dir} is not a ratrain run directory (no config.yaml)")
        cfg = RunConfig.load(Path(resume_dir) / "config.yaml")
    elif opts["config_file"]:
        cfg = RunConfig.load(opts["config_file"])
    else:
        from ratrain.models.presets import get_preset

        cfg = RunConfig(model=get_preset("tiny"))
    if opts["model"]:
        resolve_model(opts["model"], cfg)
    for key, section in _FIELDS.items():
        if opts[key] is not None:
            setattr(getattr(cfg, section), _RENAMED.get(key, key), opts[key])
    if opts["partition"]:
        try:
            cfg.parallel.partition = [int(x) for x in opts["partition"].split(",")]
        except ValueError:
            raise UserError(f"--partition must be comma-separated integers, got {opts['partition']!r}") from None
    return cfg


def use_plan_file(cfg: RunConfig, plan_file: str, opts: dict) -> None:
    """Run `plan_file`: its layout, unless the flags say otherwise (then the plan's checks
    report the clash)."""
    cfg.parallel.plan_file = str(Path(plan_file).resolve())
    try:
        layout = json.loads(Path(plan_file).read_text())
    except (OSError, ValueError):
        return  # the plan's checks explain what is wrong with the file
    if not isinstance(layout, dict):
        return
    for key, kind in (("pp", int), ("dp", int), ("rank_order", str), ("policy", str)):
        value = layout.get(key)
        if opts[key] is None and isinstance(value, kind) and not isinstance(value, bool):
            setattr(cfg.parallel, key, value)  # else the plan's checks report the clash


@cli.command()
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Run this plan (JSON from `ratrain plan --out`) instead of building one.")
@click.option("--run-dir", type=click.Path(), help="Directory for this run.  [default: runs/<time>-<model>, linked from runs/latest]")
@click.option("--resume", "resume_dir", type=click.Path(), help="Continue the run in this directory from its latest checkpoint.")
@click.option("--trace/--no-trace", default=True, show_default=True, help="Write trace.json (pipeline runs).")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON on stdout.")
def train(plan_file, run_dir, resume_dir, trace, progress, as_json, **opts) -> None:
    """Train a model. With no arguments: the embedded default run."""
    from ratrain.runtime.launch import under_torchrun
    from ratrain.train import train as run_training

    cfg = build_config(opts, resume_dir)
    if plan_file:
        use_plan_file(cfg, plan_file, opts)
    if resume_dir:
        run_dir = Path(resume_dir)
    elif run_dir:
        run_dir = Path(run_dir)
    elif under_torchrun():
        raise UserError("under torchrun, pass --run-dir: every rank must write to the same "
                        "directory (on a filesystem all nodes share)")
    summary = run_training(cfg, run_dir, resume=bool(resume_dir), progress=progress, trace=trace)
    if not summary:  # a torchrun rank other than 0
        return
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        val = summary.get("val_loss")
        click.echo(f"run: {summary.get('run_dir')}  steps: {summary.get('steps')}  "
                   f"loss: {summary.get('final_loss'):.4f}" + (f"  val loss: {val:.4f}" if val else "")
                   + f"  tokens/s: {summary.get('tokens_per_s'):.0f}")
        click.echo(_memory_line(summary))


def _memory_line(summary: dict) -> str:
    """Peak memory per pipeline stage: what the executor held (ledger), what the process grew."""
    ledger = summary.get("ledger_peak_bytes_per_stage")
    if not ledger:
        return f"peak memory: {_fmt_bytes(summary.get('peak_memory_bytes') or 0)}"
    rss = summary.get("rss_growth_bytes_per_stage") or [None] * len(ledger)
    parts = [f"stage {s}: {_fmt_bytes(held)}" + (f" (RSS +{_fmt_bytes(grown)})" if grown is not None else "")
             for s, (held, grown) in enumerate(zip(ledger, rss))]
    return "peak memory held (ledger): " + ", ".join(parts)


@cli.command()
@config_options
@click.option("--out", type=click.Path(), help="Write the plan as JSON here (for `ratrain train --plan`).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout.")
def plan(out, as_json, **opts) -> None:
    """Show the per-rank programs of a run's pipeline plan (step x rank table).

    Today this is the plan the flags describe; the resource-aware search comes with the planner.
    """
    from ratrain.schedule import format_table
    from ratrain.train import plan_for

    cfg = build_config(opts)
    cfg.validate()
    pipeline_plan = plan_for(cfg)
    if out:
        Path(out).write_text(json.dumps(pipeline_plan.to_dict(), indent=2))
    if as_json:
        click.echo(json.dumps(pipeline_plan.to_dict(), indent=2))
        return
    units = ", ".join(f"stage {s}: units {r.start}-{r.stop - 1}" for s, r in enumerate(pipeline_plan.stage_units))
    click.echo(f"{pipeline_plan.policy} {pipeline_plan.schedule}, pp={cfg.parallel.pp} dp={cfg.parallel.dp} "
               f"rank order {pipeline_plan.rank_order}, "
               f"n_micro={cfg.n_micro}; {units}")
    views = ("none (the views are the masters)" if pipeline_plan.view_window is None
             else "all resident" if pipeline_plan.view_window == 0
             else f"window {pipeline_plan.view_window}")
    activation = "; ".join(f"stage {s}: " + ",".join(choices)
                           for s, choices in enumerate(pipeline_plan.activation))
    click.echo(f"activations per unit: {activation}; views: {views}; "
               f"state home: {pipeline_plan.state_home}")
    click.echo(format_table(pipeline_plan.programs))


@cli.command()
@config_options
@click.option("--plan", "plan_file", type=click.Path(), help="Simulate this plan (JSON from `ratrain plan --out`) instead of the one the flags describe.")
@click.option("--profile", "profile_spec", default="cpu-local", show_default=True, help="Hardware profile: a preset (mt3000, a100-40g-10gbe, h100-80g-ib, cpu-local) or a YAML file from `ratrain profile`.")
@click.option("--trace", "trace_file", type=click.Path(), help="Write the simulated timeline here (Chrome trace JSON, as trace.json; open in ui.perfetto.dev).")
@click.option("--json", "as_json", is_flag=True, help="Print the prediction as JSON on stdout.")
def simulate(plan_file, profile_spec, trace_file, as_json, **opts) -> None:
    """Predict one training step on a hardware profile: step time, tokens/s, bubble, exposed
    communication and peak memory per stage, by simulating the very programs the executor runs."""
    from ratrain.layout import plan_for_config
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate as run_simulation
    from ratrain.trace import write_chrome_trace
    from ratrain.train import load_plan

    cfg = build_config(opts)
    if plan_file:
        use_plan_file(cfg, plan_file, opts)
    cfg.validate()
    hw = load_profile(profile_spec)
    hw.rate(cfg.train.dtype)  # a dtype the profile cannot compute is the user's to fix
    plan = load_plan(cfg) if plan_file else plan_for_config(cfg, hw.device.host_link is not None)
    t = cfg.train
    result = run_simulation(plan, cfg.model, hw, micro_batch_size=t.micro_batch_size,
                            seq_len=t.seq_len, dtype=t.dtype)
    if trace_file:
        actions, spans = result.trace_events()
        write_chrome_trace(trace_file, actions,
                           {s: f"stage {s} (simulated, {hw.name})" for s in actions}, spans)
    summary = {"model": cfg.model.name, "profile": hw.name, "pp": plan.pp, "dp": plan.dp,
               "n_micro": plan.n_micro, "global_batch": t.global_batch, "seq_len": t.seq_len,
               "micro_batch_size": t.micro_batch_size, "dtype": t.dtype, "policy": plan.policy,
               "memory_budget_bytes": hw.device.memory_bytes, **result.summary()}
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{cfg.model.name} on {hw.name}: pp={plan.pp} dp={plan.dp} {plan.policy}, "
               f"{plan.n_micro} micro-batches of {t.micro_batch_size} x {t.seq_len} tokens per "
               f"replica, global batch {t.global_batch} sequences, {t.dtype}")
    click.echo(f"step {result.step_time:.4g} s, {result.tokens_per_s:,.0f} tokens/s, "
               f"bubble {result.bubble:.1%}")
    rows = []
    for r in result.ranks:
        fits = "yes" if r.device_peak <= hw.device.memory_bytes else "NO"
        kinds = ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in r.at_peak.items() if v)
        rows.append([r.stage, f"{r.bubble:.1%}", f"{r.exposed:.3g} s", _fmt_bytes(r.device_peak),
                     fits, _fmt_bytes(r.peak), kinds])
    click.echo(_table(rows, ["stage", "bubble", "exposed comm", "device peak",
                             f"fits {_fmt_bytes(hw.device.memory_bytes)}", "all tiers",
                             "all tiers at their peak, by kind"]))
    if trace_file:
        click.echo(f"wrote {trace_file}")


@cli.command()
@click.option("--dtype", "compute_dtype", default="bfloat16", show_default=True,
              type=click.Choice(["float32", "bfloat16", "float16"]), help="Compute dtype of the weights column.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def models(compute_dtype: str, as_json: bool) -> None:
    """List model presets with parameter counts and the bytes of their training state."""
    from ratrain.models.params import state_bytes
    from ratrain.models.presets import PRESETS

    state_keys = ("compute_weights", "master_weights", "gradients", "optimizer", "total")
    out = []
    for name, m in PRESETS.items():
        out.append({"name": name, "layers": m.n_layers, "dim": m.dim, "heads": m.n_heads,
                    "kv_heads": m.n_kv_heads, "vocab": m.vocab_size, "position": m.position,
                    "compute_dtype": compute_dtype, **state_bytes(m, compute_dtype)})
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    rows = [[r["name"], _fmt_count(r["params"]), r["layers"], r["dim"], f"{r['heads']}/{r['kv_heads']}",
             r["vocab"], r["position"], *(_fmt_bytes(r[k]) for k in state_keys)] for r in out]
    click.echo(_table(rows, ["preset", "params", "layers", "dim", "heads/kv", "vocab", "pos",
                             f"weights ({compute_dtype})", "fp32 master", "fp32 grads",
                             "Adam (2 x fp32)", "total"]))


@cli.command()
@click.option("--data", type=click.Path(), help="Corpus to train on.  [default: Python's standard library]")
@click.option("--vocab-size", type=int, default=512, show_default=True)
@click.option("--out", type=click.Path(), required=True, help="Where to write tokenizer.json.")
def tokenizer(data: str | None, vocab_size: int, out: str) -> None:
    """Train a small byte-level BPE tokenizer on a corpus and save it as tokenizer.json."""
    from ratrain.data.corpus import stdlib_files, text_files
    from ratrain.data.tokenizer import train_bpe

    files = text_files(data) if data else stdlib_files()
    out_path = Path(out)
    if out_path.is_dir() or not out_path.suffix:
        out_path = out_path / "tokenizer.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(files, vocab_size, out_path)
    click.echo(f"wrote {out_path} ({tok.vocab_size} tokens, trained on {len(files)} files)")


@cli.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), required=True, help="Output directory (config.json + model.safetensors).")
def export(run_dir: str, out: str) -> None:
    """Export a run's latest checkpoint as a Hugging Face model directory."""
    from ratrain import checkpoint
    from ratrain.models.hf import save_hf
    from ratrain.models.llama import build_units

    import torch

    cfg = RunConfig.load(Path(run_dir) / "config.yaml")
    ckpt = checkpoint.latest(Path(run_dir))
    if ckpt is None:
        raise UserError(f"no checkpoint in {run_dir}/checkpoints")
    units = build_units(cfg.model, cfg.train.seed)
    for u, state in checkpoint.load_units(ckpt, range(cfg.model.n_units), torch.device("cpu")).items():
        units[u].load_state_dict(state["weights"])
    save_hf(units, cfg.model, out)
    click.echo(f"exported {ckpt.name} of {run_dir} to {out}")


@cli.command()
@click.option("--model", default="tiny", show_default=True, help="Model preset whose units are timed (embedding, one decoder block, head).")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--micro-batch-size", type=int, default=2, show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]), help="Compute dtype (masters stay fp32).")
@click.option("--ranks", type=int, help="Processes measuring at once, 1 thread each: the load training puts on the machine.  [default: 2 on CPU (at most the cores), 1 on CUDA]")
@click.option("--out", type=click.Path(), help="Where to write the profile (YAML, for the simulator).  [default: profile-<hostname>.yaml]")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON on stdout instead of the table.")
def profile(model, seq_len, micro_batch_size, dtype, ranks, out, as_json) -> None:
    """Measure this machine (unit times, compute rate, memory bandwidth, links, the executor's
    overhead) and write a hardware profile the simulator takes as is."""
    from ratrain.profiling import default_out, measure, summary_rows

    path = Path(out) if out else default_out()
    measured = measure(model, seq_len, micro_batch_size, dtype, ranks)
    path.parent.mkdir(parents=True, exist_ok=True)
    measured.save(path)
    if as_json:
        click.echo(json.dumps(measured.to_dict(), indent=2))
        return
    header, rows = summary_rows(measured)
    click.echo(_table(rows, header))
    click.echo(f"wrote {path}")


def main() -> None:
    from ratrain.runtime.launch import exit_without_teardown, under_torchrun

    code = _run()
    if under_torchrun():
        exit_without_teardown(code)
    sys.exit(code)


def _run() -> int:
    """Run the command line; map what a user can cause to one line on stderr and an exit code."""
    from ratrain.runtime.launch import RankFailed
    from ratrain.train import TrainingDiverged

    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        return 2
    except RankFailed as e:
        click.echo(f"error: {e}", err=True)
        return 2 if e.user_error else 1
    except TrainingDiverged as e:
        click.echo(f"error: {e}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return 0


if __name__ == "__main__":
    main()
