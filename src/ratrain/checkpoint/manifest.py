"""A checkpoint's manifest: written last, it lists every file of the checkpoint with its size and
sha256, and holds what a resumed run needs besides the unit files (step, config, plan, the data
loader's position, the random generators' states, the loss scale). A checkpoint is complete only
when its manifest verifies: a crash or a full disk while saving leaves no manifest, a damaged
file a size or checksum that does not match.

The manifest holds the sha256 of its own content too (SELF): a manifest edited by hand or
damaged by a broken copy loaded what it said without a word until 2026-12-03 (another step:
the data position and learning rate of that step on the weights of this one; an optimizer
file left out of the list: a fresh AdamW state). A manifest of before then has none, and is
checked for its step only: the step its directory is named by.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

NAME = "manifest.json"
FORMAT = 1
SELF = "manifest_sha256"  # of the rest of the manifest, as _content_digest reads it


def digest(path: Path) -> dict:
    """The manifest's entry of a file: its size and sha256."""
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": sha}


def write(directory: Path, manifest: dict) -> None:
    """Write the manifest atomically (a reader sees none or all of it), after every file it
    names is on disk."""
    tmp = directory / (NAME + ".tmp")
    # as a reader will see it (JSON makes int keys strings, tuples lists), a merge's copy of
    # a part's digest left out
    content = json.loads(json.dumps({"format": FORMAT, **{k: v for k, v in manifest.items()
                                                          if k != SELF}}))
    with open(tmp, "w") as f:
        json.dump({**content, SELF: _content_digest(content)}, f, indent=1)
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
    own = manifest.pop(SELF, None)
    if own is not None and own != _content_digest(manifest):
        return None, (f"{NAME} does not match its own sha256 (edited or corrupted): its step, "
                      "files or state cannot be trusted")
    named = Path(ckpt).name
    if named.startswith("step_") and named[5:].isdigit() and int(named[5:]) != manifest["step"]:
        return None, f"{NAME} says step {manifest['step']}, its directory {named} (edited or copied?)"
    return manifest, None


def _content_digest(content: dict) -> str:
    """The sha256 of a manifest's content, however its file is laid out."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
