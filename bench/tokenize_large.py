"""Tokenize one large text file into an empty cache: time, peak RSS and tokens.

The file is the first 300 standard-library files repeated to --size-mb; the tokenizer a
byte-level BPE of 4,096 words trained on 50 of them. Each --src (a checkout's src/, to set
one version beside another) runs in a fresh process, which says which ratrain it imported: a
ratrain from outside that --src is a failed measurement, and any failed one makes the exit 1.

    python bench/tokenize_large.py --size-mb 20 --src /tmp/old/src --src src
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = """
import resource, sys, time
import ratrain
print(ratrain.__file__)
from ratrain.config import DataConfig
from ratrain.data.tokenizer import load_tokenizer
from ratrain.data.tokens import load_tokens
t = time.perf_counter()
tokens = load_tokens(DataConfig(path=sys.argv[1], cache_dir=sys.argv[2]),
                     load_tokenizer(sys.argv[3]), progress=False)
print(f"{time.perf_counter() - t:.1f} s, peak RSS "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB, {len(tokens):,} tokens")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=20)
    ap.add_argument("--src", action="append", required=True, help="a src/ directory to measure")
    args = ap.parse_args()
    for src in args.src:
        if not (Path(src) / "ratrain").is_dir():
            ap.error(f"--src {src} has no ratrain/ package: give a checkout's src/ directory")
    from ratrain.data.corpus import stdlib_files
    from ratrain.data.tokenizer import train_bpe

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp, "corpus")
        corpus.mkdir()
        files = stdlib_files()[:300]
        text = "".join(f.read_text(errors="replace") for f in files)
        with open(corpus / "corpus.txt", "w") as out:
            while out.tell() < args.size_mb * 1e6:
                out.write(text)
        tokenizer = Path(tmp, "tokenizer.json")
        train_bpe(files[:50], 4096, tokenizer)
        print(f"{(corpus / 'corpus.txt').stat().st_size / 1e6:.0f} MB file")
        failed = 0
        for i, src in enumerate(args.src):
            proc = subprocess.run([sys.executable, "-c", MEASURE, str(corpus), f"{tmp}/cache{i}",
                                   str(tokenizer)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(Path(src).resolve())})
            said = measured(proc, Path(src))
            failed += said.startswith("failed")
            print(f"{src}: {said}")
    return 1 if failed else 0


def measured(proc: subprocess.CompletedProcess, src: Path) -> str:
    """The measurement MEASURE printed, or why it is none: it failed, or it measured a ratrain
    from elsewhere (an installed one ahead of PYTHONPATH) under `src`'s name."""
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or len(lines) != 2:
        return f"failed (exit {proc.returncode}): {proc.stderr[-200:]}"
    if not Path(lines[0]).resolve().is_relative_to(src.resolve()):
        return f"failed: it imported {lines[0]}, not the ratrain under {src}"
    return lines[1]

if __name__ == "__main__":
    sys.exit(main())
