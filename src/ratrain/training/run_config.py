"""The config of a run directory a command goes on with (`train --resume`, `export`,
`merge-parts`, `report`): its config.yaml, or one line that says why there is none, in the
same words from every command (until 2026-12-03 they said "does not exist", "not a ratrain run
directory" of a directory that was not there, and the same of one whose config.yaml alone was
gone)."""

from __future__ import annotations

from pathlib import Path

from ratrain.config import RunConfig
from ratrain.errors import UserError


def run_config(run_dir: str | Path, named_as: str | None = None) -> RunConfig:
    """RUN/config.yaml, read; a UserError where `run_dir` is not there, where its config.yaml
    is gone from beside a run's checkpoints or metrics, or where it holds no run.
    `named_as`: how the command's user named it (`--resume RUN`), where not by the path alone.

    The newest checkpoint's manifest holds the config it was saved with: it is named, not
    taken, since config.yaml holds the settings of the run's last start, which may be newer,
    and the user knows which to put back."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UserError(f"{named_as or run_dir}: no such directory")
    if (run_dir / "config.yaml").is_file():
        return RunConfig.load(run_dir / "config.yaml")
    from ratrain import checkpoint
    from ratrain.checkpoint import manifest

    held = checkpoint.complete_dirs(run_dir) if run_dir.is_dir() else []
    what = [f"checkpoints ({held[-1].name})"] if held else []
    if (run_dir / "metrics.jsonl").is_file():
        what.append("metrics.jsonl")
    if not what:
        raise UserError(f"{run_dir} is not a ratrain run directory (no config.yaml)")
    restore = ("; its newest checkpoint's manifest holds the config it was saved with "
               f"({held[-1] / manifest.NAME}, under \"config\")") if held else ""
    raise UserError(f"{run_dir}/config.yaml is missing: {run_dir} holds a run's "
                    f"{' and '.join(what)}, which are read with its settings; put config.yaml "
                    f"back{restore}")
