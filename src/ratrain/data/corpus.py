"""Where training text comes from: the built-in standard-library corpus or the user's files.

Nothing can be downloaded at run time, so the default corpus is the source of the running
Python's standard library: every machine has it, it is real text, and it is the same on every
rank of a run.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

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


def read_text(path: Path) -> str:
    """A file's text as UTF-8; undecodable bytes become U+FFFD instead of failing the run."""
    return path.read_text(encoding="utf-8", errors="replace")


def _walk(root: Path, want, skip_dirs=frozenset()) -> list[Path]:
    # Prune while walking: a venv's site-packages can be 20x the size of the stdlib itself.
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs and not d.startswith(".")]
        paths = (Path(dirpath, f) for f in filenames if want(f))
        found.extend(p for p in paths if p.is_file())  # drops broken symlinks
    return found


def _sorted_under(root: Path, paths) -> list[Path]:
    return sorted(paths, key=lambda p: p.relative_to(root).as_posix())
