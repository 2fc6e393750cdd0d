"""What a resumed run may change, in one table: every check of a resume against the run it
continues (its flags, a --config given again, `--resume auto`'s command line, another run's
checkpoint) reads it here.

The model, data and train sections are the run's math and data, but for FREE_ON_RESUME's
fields. The parallel section is how the math is computed, not what: a resume may change it
(another pp/dp, plan or memory policy)."""

from __future__ import annotations

from pathlib import Path

from ratrain.config import RunConfig
from ratrain.errors import UserError
from ratrain.training.run_tokenizer import tokenizer_file

# How long the run trains, how often it evaluates and saves, how it fails, what it writes
# besides and where it caches; and DiLoCo's outer step, retuned when a run changes its sync
# (its workers, or from diloco to step and back: training/resuming.py).
FREE_ON_RESUME = {
    ("train", key) for key in (
        "steps", "eval_every", "eval_batches", "checkpoint_every", "keep_checkpoints",
        "checkpoint_on_interrupt", "tensorboard", "profile", "checkpoints", "checkpoint_dir",
        "checkpoint_async", "outer_lr", "outer_momentum", "outer_mix")} | {("data", "cache_dir")}

# Config fields that name a file: one setting however it is spelled (data.txt, /here/data.txt).
PATH_FIELDS = {("data", "path"), ("data", "tokenizer"), ("train", "init_from")}

# Fixed, but not held to another run's checkpoint: a resume on more replicas fits the
# micro-batch to a replica's share (cli/options._fit_micro_batch), and the weights a run
# started from are in its checkpoint, wherever that directory went since.
_NOT_THE_CHECKPOINTS = {("train", "micro_batch_size"), ("train", "init_from")}


def fixed_on_resume(section: str, key: str) -> bool:
    """Whether a config field is the run's math or data, which a resume may not change."""
    return section in ("model", "data", "train") and (section, key) not in FREE_ON_RESUME


def same_setting(field: tuple[str, str], a, b, run_copy: str | None = None) -> bool:
    """Whether two values of a config field are the same setting: paths by the file they
    name (data.txt and /here/data.txt are one), relative ones from this directory; tokenizers
    by the bytes of their files, so that the run's own copy (RUN/tokenizer.json,
    run_tokenizer.py), or the original's contents elsewhere, is the run's tokenizer (until
    2026-12-03 it was refused as another). `run_copy`: that copy, the tokenizer the run
    trained with however `a`'s file has changed since (replaced by another tokenizer, `b`
    of the copy's bytes is the run's: until 2026-12-03 refused, as `a`'s were compared)."""
    if a == b:
        return True
    if field not in PATH_FIELDS or not isinstance(a, str) or not isinstance(b, str) or "byte" in (a, b):
        return False
    if Path(a).expanduser().resolve() == Path(b).expanduser().resolve():
        return True
    return field == ("data", "tokenizer") and any(
        _same_bytes(tokenizer_file(was), tokenizer_file(b)) for was in (a, run_copy) if was)


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_size == b.stat().st_size and a.read_bytes() == b.read_bytes()
    except OSError:  # one not there (moved, unreadable): not shown to be the same
        return False


def changed_settings(saved: dict, now: dict, run_copy: str | None = None
                     ) -> list[tuple[str, str, object, object]]:
    """The fixed fields two runs' config dicts (RunConfig.to_dict) set apart, in config order:
    (section, key, saved value, value now); `run_copy`: the saved run's copy of its tokenizer
    (same_setting)."""
    return [(section, key, saved[section].get(key), value)
            for section in ("model", "data", "train") for key, value in now[section].items()
            if fixed_on_resume(section, key)
            and not same_setting((section, key), saved[section].get(key), value, run_copy)]


def refuse_another_runs(ckpt: Path, meta: dict, cfg: RunConfig, settings: bool = True) -> None:
    """A checkpoint of another model, or (`settings`) of another run of it (another --seq-len,
    batch, lr, seed, dtype, data or optimizer setting: a --checkpoint-dir that holds another
    run's), is refused, naming the first setting that differs."""
    saved_cfg = RunConfig.from_dict(meta["config"])
    saved = saved_cfg.model
    if saved != cfg.model:
        diff = ", ".join(f"{k}={getattr(saved, k)} (run has {getattr(cfg.model, k)})"
                         for k in vars(saved) if getattr(saved, k) != getattr(cfg.model, k))
        raise UserError(f"checkpoint {ckpt} is of another model: {diff}")
    changed = [c for c in changed_settings(saved_cfg.to_dict(), cfg.to_dict())
               if c[0] != "model" and c[:2] not in _NOT_THE_CHECKPOINTS] if settings else []
    if changed:
        section, key, was, now = changed[0]
        raise UserError(f"checkpoint {ckpt} is of another run: it was saved with "
                        f"{section}.{key} = {was!r}, this run has {now!r}")
