"""Token streams: tokenize a corpus once, cache it on disk, memory-map it on every later run.

A token stream is a flat, read-only array of ids. Documents (files; a `.jsonl` file's records)
are concatenated in corpus order, each followed by the tokenizer's end-of-document id when it
has one.

Pre-tokenized input: a data path ending in `.bin` is a raw little-endian array of ids and is
memory-mapped as is, with no tokenizer involved: `name.bin` (or `name.u16.bin`) holds uint16
ids, `name.u32.bin` uint32 ids, whatever the suffixes' case. A directory is a corpus whatever its
name. Cached streams follow the same convention, so a cache file can be passed as a data path
directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ratrain.config import DataConfig
from ratrain.data.corpus import (corpus_files, documents, find_again, keep_findings,
                                 kept_findings, stream_damage, undecodable_warning)
from ratrain.data.tokenizer import Tokenizer
from ratrain.errors import UserError

# Bump when the layout of cached streams changes, so old caches are never misread (2: .jsonl
# files as their records' text, long files in pieces; 3: line ends as in the file, special
# tokens' text as text, lone surrogates as U+FFFD).
_CACHE_FORMAT = 3
# Pieces handed to the tokenizer at once (encode_batch runs them in parallel), and at most
# this many characters of them: the tokenizer's output for them is held until they are
# written (about 430 bytes a token), so the batch, not the corpus, sets the memory.
_PIECES_PER_BATCH = 64
_CHARS_PER_BATCH = 16 << 20
# A partial stream not written to for this long was left by a killed run (a live one writes
# every batch; an exception removes its own): the next tokenization removes it.
_STALE_PART_S = 24 * 3600
# Beside every cached stream: its files' findings (corpus.keep_findings), worded at every read.
# No text suffix (it was .json): a cache inside the corpus read its own findings as a file of
# it, a new corpus every run.
_FINDINGS_SUFFIX = ".undecodable"


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned little-endian dtype that holds every id below `vocab_size`."""
    return np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")


def is_token_file(path: str | Path | None) -> bool:
    """Whether a data path names a pre-tokenized stream: `.bin`, in any case, and no directory
    (`UP.BIN` was decoded as UTF-8 text and trained on; a directory `x.bin/` was "not found")."""
    return (path is not None and str(path).lower().endswith(".bin")
            and not Path(path).expanduser().is_dir())


def cache_root(data_cfg: DataConfig) -> Path:
    """data.cache_dir, else $RATRAIN_CACHE, else ~/.cache/ratrain."""
    root = data_cfg.cache_dir or os.environ.get("RATRAIN_CACHE") or "~/.cache/ratrain"
    return Path(root).expanduser()


@dataclass(frozen=True)
class Corpus:
    """A data path's token stream, the files it was read from, and (`warnings`) what they warned
    of: a run says these at its start whether it tokenized the files now or mapped their cache."""

    tokens: np.ndarray
    files: list[Path]
    findings: Path | None = None  # beside the cached stream, its paths relative to `root`
    root: Path | None = None
    progress: bool = False

    @property
    def warnings(self) -> list[str]:
        """The files mostly undecodable, as warnings; for a stream cached without its findings,
        found once (corpus.find_again) here, where they are said, not by every rank's loader."""
        kept = kept_findings(self.findings) if self.findings else []
        if kept is None:  # ([]: none of its files warned)
            kept = find_again(self.files, self.root, self.findings, self.progress,
                              len(self.tokens))
        return [undecodable_warning(self.root / name, fraction) for name, fraction in kept]


def read_corpus(data_cfg: DataConfig, tokenizer: Tokenizer, progress: bool = True,
                tokenize: bool = True) -> Corpus:
    """The token stream of `data_cfg.path` (None: the standard library), as a read-only memmap,
    with the files it holds and its warnings (files mostly undecodable), which are kept beside
    the cached stream: said only while tokenizing, they were never seen again by a run that
    mapped the cache.

    The first call tokenizes (with a progress bar on stderr unless `progress` is False) and
    writes the stream under `cache_root(data_cfg)/tokens/`; later calls with the same
    tokenizer and unchanged files (see _cache_key) map that file.
    The cache file appears atomically, so a crash never leaves a truncated stream behind and
    concurrent runs never read a half-written one. `tokenize` False: another process of this
    machine tokenizes (a node's first torchrun rank), so wait for its file rather than make
    a second one.
    """
    if is_token_file(data_cfg.path):
        return Corpus(load_bin(data_cfg.path), [Path(data_cfg.path).expanduser()])
    root, files = corpus_files(data_cfg.path)
    dtype = token_dtype(tokenizer.vocab_size)
    suffix = ".bin" if dtype.itemsize == 2 else ".u32.bin"
    key = _cache_key(tokenizer, root, files)
    path = cache_root(data_cfg) / "tokens" / (key + suffix)
    found = path.parent / (key + _FINDINGS_SUFFIX)
    if tokenize and path.exists() and (damage := stream_damage(path, found, dtype.itemsize)):
        print(f"warning: the token cache entry {damage}: tokenizing the data again",
              file=sys.stderr, flush=True)
        with _cache_writes(path.parent):
            path.unlink(missing_ok=True)
    if not path.exists() and tokenize:
        _tokenize_to(path, files, tokenizer, dtype, progress, found, root)
    _wait_for(path, ready=lambda: not stream_damage(path, found, dtype.itemsize))
    return Corpus(np.memmap(path, dtype=dtype, mode="r"), files, found, root, progress)


def load_tokens(data_cfg: DataConfig, tokenizer: Tokenizer, progress: bool = True,
                tokenize: bool = True) -> np.ndarray:
    """read_corpus's token stream, its warnings said on stderr (every call, cached or not)."""
    corpus = read_corpus(data_cfg, tokenizer, progress, tokenize)
    for line in corpus.warnings:
        print(line, file=sys.stderr, flush=True)
    return corpus.tokens


def load_bin(path: str | Path) -> np.ndarray:
    """Memory-map a pre-tokenized `.bin` (uint16) or `.u32.bin` (uint32) file, read-only."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"data path not found: {path}")
    dtype = np.dtype("<u4" if path.name.lower().endswith(".u32.bin") else "<u2")
    size = path.stat().st_size
    if size == 0:
        raise UserError(f"token file {path} is empty")
    if size % dtype.itemsize:
        raise UserError(
            f"token file {path} has {size} bytes, not a whole number of {dtype} ids "
            "(files ending in .u32.bin hold uint32 ids, other .bin files uint16)"
        )
    return np.memmap(path, dtype=dtype, mode="r")


def check_token_ids(tokens: np.ndarray, model_vocab_size: int, path: str = "") -> None:
    """Refuse a stream holding ids the model cannot embed (pre-tokenized files are unchecked),
    and a plain `.bin` (read as uint16) for a model whose vocabulary needs more: a uint32
    stream read so passes every other check (its halves are ids below 65,536) and trains on
    garbage. `name.u16.bin` says that uint16 is meant."""
    if (model_vocab_size > 1 << 16 and tokens.dtype.itemsize == 2
            and not path.lower().endswith(".u16.bin")):
        raise UserError(
            f"{path} is read as uint16 ids (0-65,535: files ending in .u32.bin hold uint32), but "
            f"the model's vocabulary has {model_vocab_size:,} words, whose ids need uint32: "
            f"name a uint32 stream .u32.bin (or a uint16 one .u16.bin)")
    top = int(tokens.max())
    if top >= model_vocab_size:
        raise UserError(
            f"the token stream holds id {top} but the model's vocabulary is {model_vocab_size}"
        )


def split_train_val(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val): the last `val_fraction` of the stream is validation. Views, no copies.

    Whether each part is long enough for a sequence is the loader's check, which knows seq_len.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"data.val_fraction must be in [0, 1), got {val_fraction}")
    cut = len(tokens) - int(len(tokens) * val_fraction)
    return tokens[:cut], tokens[cut:]


WHOLE_HASH_BYTES = 1 << 30
"""Streams up to this size are hashed whole (about a second); a larger one by SAMPLES windows:
a 100B-token corpus hashed whole would hold every rank's first checkpoint for minutes."""
SAMPLES, SAMPLE_TOKENS = 256, 1 << 19


def stream_fingerprint(tokens: np.ndarray, chunk: int = 8 << 20) -> str:
    """A hash of a token stream's bytes, by which a resume tells data edited in place at the
    same length: of all of them up to WHOLE_HASH_BYTES, else of its length and SAMPLES evenly
    spread windows (an edit between them goes unseen there). In chunks: a memmap's tobytes()
    copies it whole."""
    h = hashlib.sha256()
    if tokens.nbytes <= WHOLE_HASH_BYTES:
        spans = [(i, i + chunk) for i in range(0, len(tokens), chunk)]
    else:
        h.update(str(len(tokens)).encode())
        step = (len(tokens) - SAMPLE_TOKENS) // (SAMPLES - 1)
        spans = [(i * step, i * step + SAMPLE_TOKENS) for i in range(SAMPLES)]
    for a, b in spans:
        h.update(np.ascontiguousarray(tokens[a:b]))
    return h.hexdigest()[:32]


def _cache_key(tokenizer: Tokenizer, root: Path, files: list[Path]) -> str:
    # The resolved root: two corpora's files of the same relative names, sizes and mtimes (cp -p,
    # archives of fixed mtimes) shared a stream. The inode and ctime: a rewrite keeping size and
    # mtime (a restored mtime) changes the ctime, which nothing sets back; stat only, as a read
    # of every file's head and tail would be all of a corpus of small files, on every run. A
    # chmod re-tokenizes too, which costs time, never a wrong stream.
    listing = []
    for f in files:
        st = f.stat()
        listing.append((f.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns,
                        st.st_ctime_ns, st.st_ino))
    blob = json.dumps([_CACHE_FORMAT, tokenizer.name, str(root.resolve()), listing]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


@contextmanager
def _cache_writes(directory: Path):
    """A write into the token cache that fails as one line naming the cache, not as the OS
    error of its temporary file. No tokens kept in memory instead: the other ranks of the run
    map the cached file (and under torchrun wait for it), and each would hold the corpus."""
    try:
        yield
    except OSError as e:
        why = next((f"{p} is not a directory" for p in (directory, *directory.parents)
                    if p.exists() and not p.is_dir()), e.strerror or str(e))
        raise UserError(f"cannot write the token cache {directory} ({why}): set RATRAIN_CACHE "
                        "(or data.cache_dir in a --config file) to a writable directory"
                        ) from None


def _tokenize_to(path: Path, files: list[Path], tokenizer: Tokenizer, dtype: np.dtype,
                 progress: bool, found: Path, root: Path) -> None:
    with _cache_writes(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(path.parent)
        # The temporary file sits next to the target so the final rename stays on one
        # filesystem.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".part")
    eos = np.array([] if tokenizer.eos_id is None else [tokenizer.eos_id], dtype=dtype)
    n_text = n_all = 0  # tokens of text, and all: empty documents add their end-of-document ids
    undecodable: list[tuple[Path, float]] = []
    try:
        sizes = [f.stat().st_size for f in files]
        with os.fdopen(fd, "wb") as out, tqdm(
            total=sum(sizes), unit="B", unit_scale=True, desc="tokenizing", file=sys.stderr,
            disable=not progress,
        ) as bar:
            for batch in _batches(files, sizes, bar, undecodable):
                for ids, (_, ends) in zip(tokenizer.encode_batch([t for t, _ in batch]), batch):
                    with _cache_writes(path.parent):
                        out.write(ids.astype(dtype, copy=False).tobytes())
                        if ends:
                            out.write(eos.tobytes())
                    n_text += len(ids)
                    n_all += len(ids) + (len(eos) if ends else 0)
            with _cache_writes(path.parent):
                out.flush()
                os.fsync(out.fileno())
        if n_text == 0:
            what = str(files[0]) if len(files) == 1 else f"the corpus ({len(files)} files)"
            raise UserError(f"{what} holds no text to train on")
        with _cache_writes(path.parent):
            # before the stream appears: a run that finds the stream finds its findings
            keep_findings(found, undecodable, root, n_all)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache is fine to share
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_stale_parts(directory: Path) -> None:
    """Partial streams of killed runs (SIGKILL, a lost machine): as large as their corpus."""
    now = time.time()
    for part in directory.glob(".tmp-*.part"):
        try:
            if now - part.stat().st_mtime > _STALE_PART_S:
                part.unlink()
        except FileNotFoundError:  # another run's, finished or removed meanwhile
            pass


def _wait_for(path: Path, every_s: float = 2.0, ready=lambda: True) -> None:
    """Until `path` exists and is `ready()` (a damaged one: until the tokenizing rank has
    replaced it), at once where it is. A tokenizing rank that fails ends the run (its launcher
    stops the others), so there is no time limit: a corpus may take hours."""
    if path.exists() and ready():
        return
    print(f"waiting for this node's first rank to tokenize the corpus into {path}",
          file=sys.stderr, flush=True)
    while not (path.exists() and ready()):
        time.sleep(every_s)


def _batches(files: list[Path], sizes: list[int], bar, undecodable: list):
    """The corpus's pieces (corpus.documents, its findings into `undecodable`) in batches for
    the tokenizer, the progress bar moved by each file's bytes (`sizes`) as its pieces are
    read."""
    batch, chars = [], 0
    for f, size in zip(files, sizes):
        read = 0
        for text, ends in documents(f, undecodable):
            batch.append((text, ends))
            chars += len(text)
            read += len(text)
            bar.update(len(text))  # characters: a file's bytes where it is ASCII
            if len(batch) >= _PIECES_PER_BATCH or chars >= _CHARS_PER_BATCH:
                yield batch
                batch, chars = [], 0
        bar.update(max(0, size - read))  # the rest of its bytes: multi-byte text
    if batch:
        yield batch
