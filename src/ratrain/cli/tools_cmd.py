"""`ratrain models`, `tokenizer`, `export`, `merge-parts`, `profile`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ratrain.byte_units import decimal_bytes
from ratrain.cli.format import fmt_count, table
from ratrain.cli.group import cli
from ratrain.cli.json_command import JsonCommand
from ratrain.cli.out_path import refuse_unwritable, refuse_unwritable_dir
from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.run_config import run_config


@cli.command(cls=JsonCommand)
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
    rows = [[r["name"], fmt_count(r["params"]), r["layers"], r["dim"], f"{r['heads']}/{r['kv_heads']}",
             r["vocab"], r["position"], *(decimal_bytes(r[k]) for k in state_keys)] for r in out]
    click.echo(table(rows, ["preset", "params", "layers", "dim", "heads/kv", "vocab", "pos",
                             f"weights ({compute_dtype})", "fp32 master", "fp32 grads",
                             "Adam (2 x fp32)", "total"]))


@cli.command()
@click.option("--data", type=click.Path(), help="Corpus to train on.  [default: Python's standard library]")
@click.option("--vocab-size", type=int, default=512, show_default=True)
@click.option("--out", type=click.Path(), required=True, help="The tokenizer.json to write, or a directory for it (an existing one, a name ending in /, or one without a suffix).")
def tokenizer(data: str | None, vocab_size: int, out: str) -> None:
    """Train a small byte-level BPE tokenizer on a corpus and save it as tokenizer.json."""
    from ratrain.data.corpus import stdlib_files, text_files
    from ratrain.data.tokenizer import train_bpe

    files = stdlib_files() if data is None else text_files(data)  # "" is refused, not the stdlib
    if all(f.stat().st_size == 0 for f in files):  # (wrote the 257 bytes' tokenizer, unsaid)
        raise UserError(f"--data {data}: {'its files are' if len(files) > 1 else 'it is'} "
                        "empty: there is no text to train a tokenizer on")
    out_path = Path(out)
    # the trailing slash first: Path drops it, after which tok.v1/ had a suffix and was a file
    if out.endswith(("/", os.sep)) or out_path.is_dir() or not out_path.suffix:
        out_path = out_path / "tokenizer.json"
    if out_path.is_file() and not _is_tokenizer_json(out_path):
        # A corpus file named as --out by mistake would be lost, replaced by the tokenizer
        raise UserError(f"--out {out_path} is an existing file that is not a tokenizer.json; "
                        "refusing to overwrite it (give a new path or a directory)")
    # before training (23 s on the stdlib): a folder that cannot be written to failed only at
    # the save, with a traceback, and a file as its parent said "File exists"
    refuse_unwritable(out_path, "the tokenizer", "tokenizer.json", make_parents=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tok = train_bpe(files, vocab_size, out_path)
    short = (f"; the corpus gave no more merges than that, of the {vocab_size:,} asked"
             if tok.vocab_size < vocab_size else "")
    click.echo(f"wrote {out_path} ({tok.vocab_size:,} tokens, trained on {len(files)} "
               f"file{'' if len(files) == 1 else 's'}{short})")


def _is_tokenizer_json(path: Path) -> bool:
    """Whether `path` holds a Hugging Face tokenizer.json (a JSON object with a "model"), which
    training a tokenizer again may replace."""
    if path.suffix != ".json":
        return False
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(found, dict) and "model" in found


def _refuse_run_dir_out(run_dir: Path, cfg: RunConfig, out: Path) -> None:
    """Refuse, before anything is written, an --out that is the run directory (its config.json
    and tokenizer files beside the run's own, the run's tokenizer.json copied onto itself) or
    inside its checkpoints (which resumes and verification read)."""
    from ratrain import checkpoint
    from ratrain.training.run_dir import checkpoints_of

    where, there = out.resolve(), checkpoint.root(checkpoints_of(run_dir, cfg)).resolve()
    if where == run_dir.resolve():
        raise UserError(f"--out {out} is the run directory itself: export into a directory of "
                        f"its own, e.g. --out {run_dir / 'hf'} or one outside the run")
    if where == there or there in where.parents:
        raise UserError(f"--out {out} is inside the run's checkpoint directory {there}: export "
                        f"into a directory of its own, e.g. --out {run_dir / 'hf'}")


@cli.command()
@click.argument("run_dir", type=click.Path())
@click.option("--out", type=click.Path(), required=True, help="Output directory (config.json + model.safetensors, the run's tokenizer as tokenizer.json + tokenizer_config.json).")
@click.option("--replica", type=int, help="--sync diloco runs: this replica's own weights (its island's, with islands) instead of the outer parameters (the replicas' last outer sync).")
@click.option("--checkpoint-dir", type=click.Path(), help="Where the run's checkpoints are, if not where its config.yaml says (moved since).")
@click.option("--tokenizer", "tokenizer_spec", help="The run's tokenizer, if not where its config.yaml says (moved since), or of a run on pre-tokenized .bin ids: 'byte' or a tokenizer.json (or a directory holding one). Another than the run's is refused.")
def export(run_dir: str, out: str, replica: int | None, checkpoint_dir: str | None,
           tokenizer_spec: str | None) -> None:
    """Export a run's newest checkpoint that verifies as a Hugging Face model directory, with
    the tokenizer it trained with; of a --sync diloco run, its outer parameters (--replica R:
    that replica's own weights)."""
    import torch

    from ratrain import checkpoint
    from ratrain.checkpoint import manifest
    from ratrain.checkpoint.store import outer_weights
    from ratrain.models.hf import check_export_dir, save_hf
    from ratrain.models.hf_files import refuse_other_files
    from ratrain.models.llama import build_units
    from ratrain.cli.export_checks import baichuan_note, export_tokenizer
    from ratrain.training.run_dir import resume_point

    refuse_unwritable_dir(out, "the export")  # before the checkpoint is read and hashed
    check_export_dir(out)  # (minutes at 7B)
    cfg = run_config(run_dir)
    tok = export_tokenizer(cfg, Path(run_dir), tokenizer_spec,
                           f"ratrain export {run_dir} --out {out}")
    if checkpoint_dir:
        cfg.train.checkpoint_dir = checkpoint_dir
    _refuse_run_dir_out(Path(run_dir), cfg, Path(out))
    # torch_dtype is the checkpoint's, known once read: compared exactly just before writing
    refuse_other_files(Path(out), _written(cfg, tok, torch.float32), loose=("torch_dtype",))
    diloco = cfg.parallel.diloco
    if replica is not None and not (diloco and 0 <= replica < cfg.parallel.dp):
        raise UserError(f"--replica {replica}: {run_dir} has " + (
            f"replicas 0-{cfg.parallel.dp - 1}" if diloco else
            "one set of weights (only --sync diloco's replicas keep their own)"))
    with torch.device("meta"):  # shapes only: every weight comes from the checkpoint (a 7B
        units = build_units(cfg.model, cfg.train.seed)  # model's init took ~40 s for nothing)
    outer = diloco and replica is None
    for tries_left in reversed(range(3)):
        ckpt = resume_point(Path(run_dir), cfg, done_ok=True, way_out=f"export with `ratrain "
                            f"export {run_dir} --out {out} --checkpoint-dir DIR`")
        try:
            meta = checkpoint.load_meta(ckpt)  # read now: the run may remove it once loaded
            states = checkpoint.load_units(ckpt, range(cfg.model.n_units), torch.device("cpu"),
                                           cfg.parallel.files_of(replica or 0), optimizer=False,
                                           verified=True)
            for u, state in states.items():
                with_outer = outer and state["outer"] is not None
                units[u].load_state_dict(outer_weights(units[u], state) if with_outer
                                         else state["weights"], assign=True)
            break
        except (checkpoint.CheckpointDamaged, FileNotFoundError):
            # verified a moment ago, now short of files: a run training in this directory
            # removed it (keep-K), which until 2026-12-03 was said as a save that did not finish
            if manifest.problem(ckpt, hashed=False) is None:
                raise
            if not tries_left:
                raise UserError(f"checkpoint {ckpt} was removed while being read (a run training "
                                f"in {run_dir} rotates its checkpoints): export again, or once "
                                "the run has stopped") from None
    refuse_other_files(Path(out), _written(cfg, tok, next(units[0].parameters()).dtype))
    save_hf(units, cfg.model, out, tok.token_ids if tok else None)
    if tok:
        tok.write(Path(out), cfg.model.max_seq_len)
    what = (_outer_said(cfg.parallel.sync, meta) if outer else
            f" (replica {replica}'s own weights)" if replica is not None else "")
    click.echo(f"exported {ckpt.name} of {run_dir} to {out}{what}")
    click.echo(f"tokenizer: {tok}" if tok else f"tokenizer: none written: {run_dir} trained on "
               f"pre-tokenized ids ({cfg.data.path}), whose tokenizer ratrain does not know; "
               "--tokenizer FILE writes it")
    if note := baichuan_note(cfg):
        click.echo(note, err=True)


def _written(cfg: RunConfig, tok, dtype) -> dict[str, bytes]:
    """The bytes of each file an export writes beside the weights (its config.json with
    `dtype`, the tokenizer's files), written to a scratch directory to be compared."""
    import tempfile

    from ratrain.models.hf import hf_config
    from ratrain.models.hf_files import write_config

    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        write_config(where, hf_config(cfg.model, dtype),
                     tok.token_ids if tok else {})
        if tok:
            tok.write(where, cfg.model.max_seq_len)
        return {f.name: f.read_bytes() for f in where.iterdir()}


def _outer_said(sync: str, meta: dict) -> str:
    """What a --sync diloco export's outer parameters at checkpoint `meta` are. Before a unit's
    first outer sync they are the starting weights, which until 2026-12-03 an export before
    step H wrote as "the replicas' last outer sync"."""
    from ratrain.schedule.outer_sync import parse_sync

    outer, step = parse_sync(sync), meta["step"]
    firsts = [outer.first_synced_after(f) for f in range(outer.fragments or 1)]
    # a run's last step syncs every unit (outer_sync.final_sync_due)
    last = step >= meta.get("config", {}).get("train", {}).get("steps", step + 1)
    synced = len(firsts) if last else sum(step >= first for first in firsts)
    if synced == 0:
        return (f" (the outer parameters: no outer sync yet at step {step}, the first is at step "
                f"{min(firsts)}: these are the starting weights; --replica R exports a "
                "replica's trained weights)")
    if synced < len(firsts):
        return (f" (the outer parameters: {synced} of {len(firsts)} fragments have had an outer "
                "sync, the rest's units hold the starting weights; --replica R exports a "
                "replica's trained weights)")
    return (" (the outer parameters: the replicas' last outer sync; --replica R exports a "
            "replica's own weights)")


@cli.command("merge-parts")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path())
@click.option("--out", type=click.Path(), required=True, help="A new run directory: the merged checkpoint, with the config.yaml, plan.json, metrics.jsonl and tokenizer.json (the run's copy) of rank 0's node, and its summary.json and trace.json where the merged step is the run's end.")
def merge_parts_cmd(run_dirs: tuple[str, ...], out: str) -> None:
    """Merge the checkpoint parts of a run whose nodes kept their own (a checkpoint directory
    not shared by the nodes: each node's run directory, brought to one filesystem) into one
    run directory: the newest step every part holds, which any layout resumes and `export`
    reads, with rank 0's node's run files (training/merged_run.copy_run_files)."""
    from ratrain import checkpoint
    from ratrain.checkpoint.merge import merge_parts, newest_common_step
    from ratrain.training.merged_run import copy_run_files
    from ratrain.training.run_dir import checkpoints_of

    out_dir = Path(out)
    refuse_unwritable_dir(out, "the merged run")  # before every part is hashed
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out} exists and is not empty: merge into a new directory")
    cfgs = []
    for d in run_dirs:
        cfgs.append(run_config(d))
    roots = [checkpoints_of(Path(d), c) for d, c in zip(run_dirs, cfgs)]
    step, skipped = newest_common_step(roots)
    for why in skipped:
        click.echo(f"skipping checkpoint {why}; the newest step every part holds that verifies "
                   f"is step_{step:06d}", err=True)
    parts = [checkpoint.checkpoint_dir(r, step) for r in roots]
    merged = merge_parts(parts, out_dir, step, verified=True)
    main = next(i for i, p in enumerate(parts) if 0 in checkpoint.load_meta(p)["ranks"])
    left_out = copy_run_files(Path(run_dirs[main]), out_dir, step)
    if left_out:
        click.echo(f"note: {left_out}", err=True)
    cfgs[main].train.checkpoint_dir = None  # the merged checkpoint is in OUT/checkpoints
    cfgs[main].save(out_dir / "config.yaml")
    click.echo(f"merged step_{step:06d} of {len(parts)} parts into {merged} (resume with "
               f"--resume {out}, with any --pp and --dp; or export it)")


@cli.command(cls=JsonCommand)
@click.option("--model", default="tiny", show_default=True, help="Model preset whose units are timed (embedding, one decoder block, head).")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--micro-batch-size", type=int, default=2, show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]), help="Compute dtype (masters stay fp32).")
@click.option("--ranks", type=int, help="Processes measuring at once, 1 thread each: ranks that share the machine (the simulator gives a rank of several threads the measured thread efficiency).  [default: 2 on CPU (at most the cores), 1 on CUDA]")
@click.option("--out", type=click.Path(), help="Where to write the profile (YAML, for the simulator).  [default: profile-<hostname>.yaml]")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON on stdout instead of the table.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Whole measurements to take; the profile holds each figure's median and names in its notes the figures that did not repeat within 10%.")
def profile(model, seq_len, micro_batch_size, dtype, ranks, out, as_json, repeats) -> None:
    """Measure this machine (unit times, compute rate, memory bandwidth, links, the executor's
    overhead) and write a hardware profile the simulator takes as is."""
    from ratrain.profiling.table import summary_rows
    from ratrain.profiling.measure import default_out, measure

    path = Path(out) if out else default_out()
    # refused before the minute of measuring: an existing directory failed only once measured
    refuse_unwritable(path, "the profile", "profile.yaml", make_parents=True)
    measured = measure(model, seq_len, micro_batch_size, dtype, ranks, repeats,
                       progress=lambda line: click.echo(line, err=True))
    path.parent.mkdir(parents=True, exist_ok=True)
    measured.save(path)
    if as_json:
        click.echo(json.dumps(measured.to_dict(), indent=2))
        return
    header, rows = summary_rows(measured)
    click.echo(table(rows, header))
    for note in ("stability", "other_work"):
        if note in measured.notes:
            click.echo(f"{note.replace('_', ' ')}: {measured.notes[note]}")
    click.echo(f"wrote {path}")
