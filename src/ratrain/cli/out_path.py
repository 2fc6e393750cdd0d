"""An --out path checked before the work whose result it takes (`profile`'s minute of
measuring, `plan`'s search), so that a path it cannot be written to loses none of it."""

from __future__ import annotations

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
