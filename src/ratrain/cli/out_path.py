"""An --out path checked before the work whose result it takes (`profile`'s minute of
measuring, `plan`'s search), so that a path it cannot be written to loses none of it; and
`plan --out`'s option files beside it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ratrain.errors import UserError


def refuse_unwritable(out: str | Path, what: str, example: str, make_parents: bool) -> None:
    """Refuse an --out that `what` ("the profile") cannot be written to: an existing directory
    (`example`: the file name to suggest in it), a parent that is a file, one without
    permission, and (unless `make_parents`: the writer makes them) a parent that does not
    exist. `plan --out` found these only after its search (25 s at llama2-70b) until
    2026-12-03, and printed no table. The refusals name `out` as given."""
    path = Path(out)
    if path.is_dir():
        raise UserError(f"--out {out} is a directory: give {what}'s file name, e.g. "
                        f"{path / example}")
    # make_parents: the nearest folder that exists (the rest are made when it is written)
    folder = _nearest_folder(out, path.parent) if make_parents else path.parent
    _trial_write(out, what, path if path.exists() else None, folder)


def refuse_unwritable_dir(out: str | Path, what: str) -> None:
    """Refuse an --out directory that `what` ("the export") cannot be written into: a file, a
    parent that is a file, one without permission (the nearest folder that exists is tried:
    the rest are made). `export` and `merge-parts` found these only once written, after
    hashing the whole checkpoint (minutes at 7B), until 2026-12-03; merge-parts named its
    internal step_N.partial. The refusals name `out` as given."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {out} is a file: give a directory for {what}")
    _trial_write(out, what, None, _nearest_folder(out, path))


def _nearest_folder(out: str | Path, folder: Path) -> Path:
    """`folder`, or the nearest above it that exists; a UserError where that is not a
    directory."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"--out {out}: {folder} is not a directory")
    return folder


def _trial_write(out: str | Path, what: str, existing: Path | None, folder: Path) -> None:
    """Open `existing` to append, or make a temporary file in `folder`: a trial write, which
    leaves nothing behind (root passes os.access on /proc)."""
    try:
        if existing is not None:
            existing.open("a").close()
        else:
            tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise UserError(f"--out {out}: cannot write {what} there "
                        f"({e.strerror or type(e).__name__})") from None


PLAN_OPTIONS = (".diloco.json", ".bf16grad.json")
"""What `plan --out FILE` writes beside FILE where the search offers it: the low-communication
option and the bf16-gradient one (FILE.diloco.json, FILE.bf16grad.json)."""


def plan_option_files(out: str | Path) -> list[Path]:
    """The option files `plan --out` writes beside `out` (PLAN_OPTIONS' order)."""
    return [Path(out).with_suffix(suffix) for suffix in PLAN_OPTIONS]


def refuse_overwriting(out: str | Path, profile_spec: str | None) -> None:
    """Refuse a `plan --out` (or an option file beside it) that is the --profile file, or an
    existing file that is not a plan (a JSON object with a plan's keys: an older plan, even one
    damaged by hand, is `plan`'s to remake). Until 2026-12-04 it overwrote either: a measured
    profile, which a GPU's machine may be needed to remake, became a plan."""
    from ratrain.cli.plan_search import profile_file_of
    from ratrain.setup.plan_file_shape import REQUIRED

    made_on = profile_file_of(profile_spec)
    profile = Path(made_on) if made_on else None
    for path in [Path(out), *plan_option_files(out)]:
        named = f"--out {out}" if path == Path(out) else f"--out {out}'s option file {path}"
        if profile is not None and path.resolve() == profile:
            raise UserError(f"{named} is the --profile file: give the plan another name")
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # not text, not JSON
            data = None
        if not (isinstance(data, dict) and all(key in data for key in REQUIRED)):
            raise UserError(f"{named} exists and is not a ratrain plan, which it would "
                            "overwrite: move it, or give another --out")


def remove_stale_options(out: str | Path, written: list) -> str | None:
    """Remove the option files beside `out` that this `plan --out` did not write (`written`):
    an earlier search's, which `train --plan` would have trained as this one's option; the line
    that says so, else None. refuse_overwriting checked they are plans."""
    gone = [path for path in plan_option_files(out) if path not in written and path.is_file()]
    for path in gone:
        try:
            path.unlink()
        except OSError as e:
            raise UserError(f"cannot remove {path}, an earlier search's option for --out "
                            f"{out} ({e.strerror or type(e).__name__})") from None
    return (f"removed {', '.join(map(str, gone))}: an earlier search's option for --out {out}, "
            "which this one does not offer") if gone else None
