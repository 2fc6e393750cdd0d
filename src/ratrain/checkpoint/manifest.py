"""A checkpoint's manifest: written last, it lists every file of the checkpoint with its size and
sha256, and holds what a resumed run needs besides the unit files (step, config, plan, the data
loader's position, the random generators' states, the loss scale). A checkpoint is complete only
when its manifest verifies: a crash or a full disk while saving leaves no manifest, a damaged
file a size or checksum that does not match.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

NAME = "manifest.json"
FORMAT = 1


def digest(path: Path) -> dict:
    """The manifest's entry of a file: its size and sha256."""
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": sha}


def write(directory: Path, manifest: dict) -> None:
    """Write the manifest atomically (a reader sees none or all of it), after every file it
    names is on disk."""
    tmp = directory / (NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, **manifest}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(directory / NAME)
    sync_dir(directory)


def sync_dir(directory: Path) -> None:
    """Make a rename or a new file in `directory` durable (a crash must not undo it)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(ckpt: Path) -> tuple[dict | None, str | None]:
    """(manifest, None), or (None, what is wrong with it)."""
    path = Path(ckpt) / NAME
    if not path.is_file():
        return None, f"no {NAME} (the save did not finish, or an older ratrain wrote it)"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"{NAME} is unreadable ({type(e).__name__})"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return None, f"{NAME} is not a ratrain checkpoint manifest of format {FORMAT}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("step"), int) or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str)
            for e in files.values()) or not all(Path(n).name == n for n in files):
        return None, f"{NAME} is damaged"
    return manifest, None


def file_problem(ckpt: Path, name: str, entry: dict, hashed: bool = True) -> str | None:
    """What is wrong with one file of the checkpoint (missing, truncated, altered), or None;
    `hashed` False: its size only, the file unread."""
    path = Path(ckpt) / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size < entry["bytes"]:
        return f"{name} is truncated ({size} of {entry['bytes']} bytes)"
    if size > entry["bytes"]:
        return f"{name} has {size} bytes, the manifest says {entry['bytes']}"
    if hashed and digest(path)["sha256"] != entry["sha256"]:
        return f"{name} does not match its sha256 in the manifest (altered or corrupted)"
    return None


def problem(ckpt: Path, hashed: bool = True) -> str | None:
    """What keeps the checkpoint from verifying, or None when every file matches its manifest;
    `hashed` False: each file there at its size (what a cut-short write or a lost file shows),
    none read."""
    manifest, wrong = read(ckpt)
    if wrong:
        return wrong
    for name, entry in sorted(manifest["files"].items()):
        wrong = file_problem(ckpt, name, entry, hashed)
        if wrong:
            return wrong
    return None
