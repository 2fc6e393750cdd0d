"""The run's own copy of its tokenizer file, RUN/tokenizer.json: config.yaml records only the
tokenizer's path, and a file replaced there since (under the same name) paired the model with
other ids without a word: `ratrain export` shipped the new file, and a resume trained on,
saying only that the training data changed."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ratrain.config import RunConfig
from ratrain.errors import UserError

COPY = "tokenizer.json"
# Its directory's files that transformers reads beside it, kept with the copy: the export
# writes their chat template and pad token (lost until 2026-12-04: the run kept neither)
BESIDE = ("tokenizer_config.json", "chat_template.jinja")


def kept_tokenizer(run_dir: str | Path) -> str | None:
    """The run's copy of its tokenizer (None: a byte-tokenizer run, or one of before
    2026-12-02, which kept none)."""
    path = Path(run_dir) / COPY
    return str(path) if path.is_file() else None


def resume_on_copy(cfg: RunConfig, run_dir: Path) -> None:
    """A resumed run whose tokenizer file, as its config.yaml names it, is gone (moved or
    deleted) takes the run's copy of it, which holds its bytes, saying so: until 2026-12-04 the
    resume stopped at "tokenizer not found", though `ratrain export` took the copy. (Another
    tokenizer in its place is refused, _refuse_another_tokenizer: the user may mean either.)"""
    source, copy = tokenizer_file(cfg.data.tokenizer), kept_tokenizer(run_dir)
    if source is None or copy is None or source.is_file():
        return
    copy = str(Path(copy).absolute())  # as config.yaml records a new run's
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"note: the tokenizer {cfg.data.tokenizer} that {run_dir}/config.yaml names is "
              f"gone: resuming on the run's copy of it, {copy}", file=sys.stderr)
    cfg.data.tokenizer = copy


def keep_run_tokenizer(run_dir: Path, cfg: RunConfig, resumed: bool) -> None:
    """At a run's start: a resume's tokenizer file checked against the run's copy (on every
    rank, so that all of them stop); a new run's (or one started over from step 0) copied,
    by rank 0 alone, as it writes config.yaml."""
    source = tokenizer_file(cfg.data.tokenizer)
    if resumed:
        _refuse_another_tokenizer(run_dir, source)
    elif source is not None and int(os.environ.get("RANK", 0)) == 0:
        copy = run_dir / COPY
        if not (copy.exists() and copy.samefile(source)):  # resumed from the copy itself
            _copy(source, copy)
            for name in BESIDE:  # (a run started over drops the last tokenizer's)
                beside = source.parent / name
                if source.name == COPY and beside.is_file():
                    _copy(beside, run_dir / name)
                else:
                    (run_dir / name).unlink(missing_ok=True)


def _copy(source: Path, to: Path) -> None:
    part = to.with_name(f".{to.name}.{os.getpid()}.part")
    shutil.copyfile(source, part)
    os.replace(part, to)


def tokenizer_file(spec: str) -> Path | None:
    """The file a data.tokenizer names (None: the byte tokenizer, which has none)."""
    if spec == "byte":
        return None
    path = Path(spec).expanduser()
    return path / "tokenizer.json" if path.is_dir() else path


def _refuse_another_tokenizer(run_dir: Path, source: Path | None) -> None:
    copy = kept_tokenizer(run_dir)
    if (copy is None or source is None or not source.is_file()  # (a missing one is said where it loads)
            or source.read_bytes() == Path(copy).read_bytes()):
        return
    # (a resume may name another file of the same bytes, the run's copy included:
    # resume_settings.same_setting; one of other bytes is refused, there as another
    # tokenizer, here where it replaced the original: that goes back where config.yaml says)
    raise UserError(f"the tokenizer {source} is not the one {run_dir} trained with (its copy, "
                    f"{copy}, holds other bytes): its ids would mean other text; put the "
                    f"original back (cp {copy} {source}) or resume on the copy (--tokenizer "
                    f"{copy}), or train the new tokenizer in a new run")
