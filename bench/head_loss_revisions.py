"""The head's chunked loss (models/head_loss.py) of this tree against another revision's, the
function alone, in one process: forward and backward of each in turn over the same inputs,
rounds alternating; the median time of the rounds after the first, the peak bytes its tensors
held at once (tests/unit/live_bytes.py's count of the storages ops create), and how far the
two results are apart.

    python bench/head_loss_revisions.py --rev 95b36dc [--tokens 4096] [--dim 512]
        [--vocab 32000] [--dtype float32] [--rounds 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))
from live_bytes import LiveBytes  # noqa: E402
from peers import machine  # noqa: E402

from ratrain.models import head_loss  # noqa: E402


def revision_module(rev: str, where: Path):
    """models/head_loss.py as it is at `rev`, loaded as a module of its own."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:src/ratrain/models/head_loss.py"],
                          check=True, capture_output=True, text=True).stdout
    path = where / "head_loss_at_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("head_loss_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(module, x, w, targets):
    loss = module.chunked_cross_entropy(x, w, targets)
    return (loss, *torch.autograd.grad(loss, (x, w)))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    x = torch.randn(args.tokens, args.dim, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(args.vocab, args.dim, generator=g) * 0.05).to(dtype).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        forms = {args.rev: revision_module(args.rev, Path(tmp)), "tree": head_loss}
        times = {name: [] for name in forms}
        for _ in range(args.rounds):
            for name, module in forms.items():
                start = time.perf_counter()
                run(module, x, w, targets)
                times[name].append(time.perf_counter() - start)
        rows, results = {}, {}
        for name, module in forms.items():
            with LiveBytes(x, w, targets) as live:
                results[name] = [t.detach() for t in run(module, x, w, targets)]
            rows[name] = {"step_s": statistics.median(times[name][1:] or times[name]),
                          "peak_bytes": live.peak}
    (a_loss, a_dx, a_dw), (b_loss, b_dx, b_dw) = results[args.rev], results["tree"]
    out = {"argv": sys.argv[1:], "machine": machine(), "settings": vars(args), "rows": rows,
           "tree_over_rev": {k: rows["tree"][k] / rows[args.rev][k] for k in ("step_s", "peak_bytes")},
           "loss_difference": abs(a_loss.item() - b_loss.item()),
           "input_grad_difference": ((a_dx - b_dx).abs().max() / a_dx.abs().max()).item(),
           "weight_grad_difference": ((a_dw - b_dw).abs().max() / a_dw.abs().max()).item()}
    for name, row in rows.items():
        print(f"{name}: {row['step_s']:.3f} s, peak {row['peak_bytes'] / 1e6:.1f} MB")
    print("tree / rev: time %.2fx, peak %.2fx; loss apart %.2g; largest gradient apart, relative to "
          "the largest: input %.2g, weight %.2g" % (out["tree_over_rev"]["step_s"],
          out["tree_over_rev"]["peak_bytes"], out["loss_difference"],
          out["input_grad_difference"], out["weight_grad_difference"]))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
