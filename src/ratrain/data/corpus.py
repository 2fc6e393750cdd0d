"""Where training text comes from: the built-in standard-library corpus or the user's files.

Nothing can be downloaded at run time, so the default corpus is the source of the running
Python's standard library: every machine has it, it is real text, and it is the same on every
rank of a run.
"""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path
from typing import Iterator

from ratrain.errors import UserError

# Installed third-party packages live inside the stdlib tree but are not the standard library
# and differ from machine to machine.
_EXCLUDED_DIRS = {"site-packages", "dist-packages"}

TEXT_SUFFIXES = frozenset(
    {".txt", ".md", ".rst", ".py", ".pyi", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go",
     ".java", ".js", ".ts", ".html", ".css", ".tex", ".sh", ".json", ".jsonl", ".yaml", ".yml",
     ".toml", ".csv", ".tsv", ".xml"}
)


def stdlib_root() -> Path:
    """The directory holding the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """All `*.py` files of the standard library (recursively; no site-/dist-packages, no
    hidden directories).

    Sorted by path relative to `stdlib_root()`, so the corpus is in the same order everywhere.
    """
    root = stdlib_root()
    return _sorted_under(root, _walk(root, lambda name: name.endswith(".py"), _EXCLUDED_DIRS))


def text_files(path: str | Path) -> list[Path]:
    """The text files a data path names: the file itself, or a directory's text-like files.

    A directory is searched recursively for files with a suffix in TEXT_SUFFIXES (hidden
    files and directories skipped), sorted by relative path.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"data path not found: {path}")
    if path.is_file():
        return [path]
    files = _sorted_under(
        path,
        _walk(path, lambda name: Path(name).suffix.lower() in TEXT_SUFFIXES and name[0] != "."),
    )
    if not files:
        raise UserError(
            f"data directory {path} holds no text files "
            f"(looked for {', '.join(sorted(TEXT_SUFFIXES))})"
        )
    return files


def corpus_files(path: str | Path | None) -> tuple[Path, list[Path]]:
    """(root, files) for a data path; None means the standard library.

    Paths relative to `root` identify the files in the token cache's key.
    """
    if path is None:
        return stdlib_root(), stdlib_files()
    files = text_files(path)
    root = Path(path).expanduser()
    return (root if root.is_dir() else root.parent), files


CHUNK_CHARS = 1 << 20
"""A text file is read and tokenized this many characters at a time, cut after a newline where
the piece has one: a 10 GB file never sits in memory whole (nor its tokenizer output, about
430 bytes a token). A file shorter than this is one piece, tokenized as a whole."""


def documents(path: Path) -> Iterator[tuple[str, bool]]:
    """A file's text in pieces, each with whether a document ends with it (the tokenizer's
    end-of-document id follows): a `.jsonl` file's records, one document each (the "text" of
    every line); any other file, one document read CHUNK_CHARS at a time. UTF-8, undecodable
    bytes as U+FFFD rather than a failed run."""
    if path.suffix.lower() == ".jsonl":
        yield from _records(path)
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read(CHUNK_CHARS)
        while more := f.read(CHUNK_CHARS):
            cut = text.rfind("\n") + 1 or len(text)  # no newline: cut anyway
            yield text[:cut], False
            text = text[cut:] + more
        yield text, True


def _records(path: Path) -> Iterator[tuple[str, bool]]:
    """A JSON Lines file's documents: each non-empty line's "text" (the Hugging Face datasets'
    layout); a line without one is refused with where it is and what it holds."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{number}: not JSON ({e.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                held = (f"keys {', '.join(sorted(record))}" if isinstance(record, dict)
                        else type(record).__name__)
                raise UserError(f"{path}:{number}: a .jsonl line needs a \"text\" string (this "
                                f"one has {held})")
            yield text, True


def _walk(root: Path, want, skip_dirs=frozenset()) -> list[Path]:
    # Prune while walking: a venv's site-packages can be 20x the size of the stdlib itself.
    # Linked directories are followed (a corpus of links to its shards' directories lost them
    # all, without a word), each real directory once, so a link back up ends.
    found, seen = [], set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.startswith(".")]
        paths = (Path(dirpath, f) for f in filenames if want(f))
        found.extend(p for p in paths if p.is_file())  # drops broken symlinks
    return found


def _sorted_under(root: Path, paths) -> list[Path]:
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())
