"""Where training text comes from: the built-in standard-library corpus or the user's files.

Nothing can be downloaded at run time, so the default corpus is the source of the running
Python's standard library: every machine has it, it is real text, and it is the same on every
rank of a run.
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
import tempfile
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
    if not str(path).strip():  # Path("") is ".": the directory the run was started in
        raise UserError("the data path is empty (--data \"\"): give a text file, a directory of "
                        "text files or a pre-tokenized .bin, or leave it out for Python's "
                        "standard library")
    path = Path(path).expanduser()
    if not path.exists():
        raise UserError(f"data path not found: {path}")
    if path.is_file():
        return [path]
    if not path.is_dir():  # a pipe (--data <(...)) or a device was "a directory of no text"
        raise UserError(f"data path {path} is neither a file nor a directory (a pipe or a "
                        "device): write the data to a file and pass that")
    files = _sorted_under(
        path,
        _walk(path, lambda name: Path(name).suffix.lower() in TEXT_SUFFIXES and name[0] != "."),
    )
    if not files:
        raise UserError(
            f"data directory {path} holds no text files "
            f"(looked for {', '.join(sorted(TEXT_SUFFIXES))})"
        )
    # a file linked under a second name is read once (it was trained on twice, and counted)
    real = [os.path.realpath(f) for f in files]
    return [f for i, f in enumerate(files) if real[i] not in real[:i]]


def corpus_files(path: str | Path | None) -> tuple[Path, list[Path]]:
    """(root, files) for a data path; None means the standard library.

    Paths relative to `root` identify the files in the token cache's key.
    """
    if path is None:
        return stdlib_root(), stdlib_files()
    files = text_files(path)
    root = Path(path).expanduser()
    return (root if root.is_dir() else root.parent), files


def skipped_files_in(path: str | Path | None) -> list[Path]:
    """The visible files of a data directory that text_files skips (pre-tokenized *.bin
    streams, other suffixes): a run on nanoGPT's layout (prepare.py, readme.md, train.bin,
    val.bin) trained on its script and readme without a word, and a README or notes.log beside
    the text were dropped unsaid (until 2026-12-04)."""
    path = Path(path).expanduser() if path is not None else None
    if path is None or not path.is_dir():
        return []
    found = _walk(path, lambda name: Path(name).suffix.lower() not in TEXT_SUFFIXES
                  and name[0] != ".", skip_dirs={"__pycache__"})  # (a code corpus's .pyc)
    return _sorted_under(path, found)


CHUNK_CHARS = 1 << 20
"""A text file is read and tokenized this many characters at a time, cut after a newline where
the piece has one: a 10 GB file never sits in memory whole (nor its tokenizer output, about
430 bytes a token). A file shorter than this is one piece, tokenized as a whole."""


MOSTLY_UNDECODABLE = 0.25
"""A file whose text is more than this fraction of U+FFFD (bytes that are no UTF-8) and NUL
(which no text holds) is no text: most likely a binary file (an archive, ids without the .bin
suffix) given as text."""


def documents(path: Path, undecodable: list | None = None) -> Iterator[tuple[str, bool]]:
    """A file's text in pieces, each with whether a document ends with it (the tokenizer's
    end-of-document id follows): a `.jsonl` file's records, one document each (the "text" of
    every line); any other file, one document read CHUNK_CHARS at a time. UTF-8, undecodable
    bytes (and a record's lone surrogate escapes) as U+FFFD rather than a failed run, with a
    warning where they are most of the file (`undecodable` given: (path, fraction) appended to
    it instead, for the caller to say; undecodable_warning words it); line ends as the file
    has them (CRLF and CR were made LF until 2026-12-02)."""
    binary = chars = 0
    for text, ends in _records(path) if path.suffix.lower() == ".jsonl" else _pieces(path):
        binary += text.count("\ufffd") + text.count("\0")
        chars += len(text)
        yield text, ends
    # the standard library's few files in other encodings are its codecs' test data
    if binary > MOSTLY_UNDECODABLE * chars and not path.is_relative_to(stdlib_root()):
        if undecodable is None:
            _warn(undecodable_warning(path, binary / chars))
        else:
            undecodable.append((path, binary / chars))


def undecodable_warning(path: Path, fraction: float) -> str:
    """The warning of a file that documents() finds mostly undecodable."""
    return (f"warning: {path}: {fraction:.0%} of its characters are U+FFFD (bytes that are no "
            "UTF-8) or NUL: it is most likely not text (pre-tokenized ids need the suffix "
            ".bin), and a run on it learns noise")


def keep_findings(found: Path, undecodable: list[tuple[Path, float]], root: Path,
                  tokens: int | None = None) -> None:
    """documents()' findings (`undecodable`) of a cached stream's files, kept beside it in
    `found` with the stream's length: {"tokens": N, "undecodable": [[path relative to `root`,
    fraction], ...]}, by which a truncated stream is told (read_findings). Until 2026-12-03 the
    list alone ([] where no file warned), and before that no file, which is read as such."""
    kept = _relative(undecodable, root)
    fd, tmp = tempfile.mkstemp(dir=found.parent, prefix=".tmp-", suffix=".part")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(kept if tokens is None else {"tokens": tokens, "undecodable": kept}, out)
        os.chmod(tmp, 0o644)
        os.replace(tmp, found)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_findings(found: Path) -> tuple[int | None, list[tuple[str, float]]] | None:
    """keep_findings' (stream length, findings): the length None in a list kept before
    2026-12-03; None where no file is kept. A ValueError where the file is not keep_findings'
    (a damaged cache entry): its findings were json.loads' traceback, or unpacked as pairs."""
    try:
        kept = json.loads(found.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        raise ValueError("not JSON") from None
    tokens = None
    if isinstance(kept, dict):
        tokens, kept = kept.get("tokens"), kept.get("undecodable")
        if type(tokens) is not int or tokens <= 0:
            raise ValueError("no token count")
    if not isinstance(kept, list) or not all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], str)
            and type(e[1]) in (int, float) for e in kept):
        raise ValueError("not a list of [file, fraction]")
    return tokens, [(name, float(fraction)) for name, fraction in kept]


def stream_damage(path: Path, found: Path, itemsize: int) -> str | None:
    """What is wrong with a cached stream of `itemsize`-byte ids (`found`: its findings and
    length, read_findings), as "FILE is damaged (why)", or None: a truncated stream was mapped
    and trained on without a word, an empty or odd-sized one or a damaged `found` was a
    traceback."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:  # removed meanwhile by a run that found it damaged
        return f"{path} is gone"
    if size == 0 or size % itemsize:
        return f"{path} is damaged ({size:,} bytes, not a whole number of {itemsize}-byte ids)"
    try:
        kept = read_findings(found)
    except ValueError as e:
        return f"{found} is damaged ({e})"
    tokens = kept and kept[0]  # None: a stream kept before its length was (2026-12-03)
    if tokens is not None and tokens != size // itemsize:
        return f"{path} is damaged ({size // itemsize:,} tokens, {found.name} records {tokens:,})"
    return None


def kept_findings(found: Path) -> list | None:
    """keep_findings' list; None where a cached stream has none, or none that reads."""
    try:
        kept = read_findings(found)
    except ValueError:  # found again, and kept whole
        return None
    return None if kept is None else kept[1]


def find_again(files: list[Path], root: Path, found: Path, progress: bool,
               tokens: int | None = None) -> list:
    """The findings of a cached stream that has none, its files (the ones its cache key's stat
    names) read again, and kept (with its length, `tokens`). Read, not tokenized nor the stream rebuilt: on the standard
    library (31.5 MB, 2 cores, 2026-12-03) the read took 0.1 s, an 8,000-token BPE 42 s."""
    from tqdm import tqdm

    undecodable: list[tuple[Path, float]] = []
    with tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True,
              desc="checking the cached corpus", file=sys.stderr, disable=not progress) as bar:
        for f in files:
            for _ in documents(f, undecodable):
                pass
            bar.update(f.stat().st_size)
    try:
        keep_findings(found, undecodable, root, tokens)
    except OSError:  # a cache this user may read, not write (a shared one): found again next run
        pass
    return _relative(undecodable, root)


def _relative(undecodable: list[tuple[Path, float]], root: Path) -> list[tuple[str, float]]:
    return [(f.relative_to(root).as_posix(), fraction) for f, fraction in undecodable]


def _warn(line: str) -> None:
    # tqdm's write keeps the tokenizing bar whole; the import waits for the first warning
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def _pieces(path: Path) -> Iterator[tuple[str, bool]]:
    """A text file as one document, CHUNK_CHARS at a time."""
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        text = f.read(CHUNK_CHARS)
        while more := f.read(CHUNK_CHARS):
            # after a line end, a CR only where the piece has no LF (old Mac files); else
            # anywhere; never after a last CR, whose LF may open `more`
            cut = (text.rfind("\n") + 1 or text.rfind("\r", 0, len(text) - 1) + 1
                   or len(text) - text.endswith("\r"))
            yield text[:cut], False
            text = text[cut:] + more
        yield text, True


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "a boolean", type(None): "null"}


def _records(path: Path) -> Iterator[tuple[str, bool]]:
    """A JSON Lines file's documents: each non-empty line's "text" (the Hugging Face datasets'
    layout); a line without one is refused with where it is and what it holds."""
    # utf-8-sig: a BOM opening the file is no JSON. Lines end at LF alone: a CRLF line's CR is
    # JSON whitespace, and a lone CR is no line end in JSON Lines.
    with open(path, encoding="utf-8-sig", errors="replace", newline="\n") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                msg = e.msg.removesuffix(" at")  # "Invalid control character at": where follows
                raise UserError(f"{path}:{number}: not JSON ({msg} at column {e.colno})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise UserError(f"{path}:{number}: a .jsonl line needs a \"text\" string "
                                f"({_what_it_holds(record)})")
            yield without_surrogates(text), True


_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """`text` with its lone surrogates as U+FFFD: a JSON escape of half a surrogate pair (a cut
    emoji, common in scraped text) has no UTF-8, and failed both tokenizers with a traceback."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _what_it_holds(record) -> str:
    if not isinstance(record, dict):
        return f"this one is {_JSON_TYPES[type(record)]}"
    if "text" in record:
        return f"this one's \"text\" is {_JSON_TYPES[type(record['text'])]}"
    return f"this one has keys {', '.join(sorted(record))}" if record else "this one is {}"


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
