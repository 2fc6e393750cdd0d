"""What the head's loss in chunks (models/head_loss.py) saves and costs: the same steps with the
plain logits-then-cross-entropy and with the chunked loss, each in a fresh process, in rounds
(a shared machine's drift hits both alike).

The model is a LLaMA block stack with a vocabulary large against its width, so the head's
logits are most of its activations, as at Llama 3's 128,256 words. Each run reports the
executor's ledger peak by kind, the process's peak RSS over its size before the first step, and
the median step time; the summary gives chunked / plain for each.

    python bench/head_loss.py [--vocab 32000] [--dim 256] [--layers 2] [--seq-len 1024]
        [--micro-batch-size 4] [--steps 4] [--rounds 2] [--out bench/results/head_loss.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402


def worker(args) -> dict:
    """One run in this process: `args.mode` "plain" or "chunked"."""
    import torch

    from ratrain.config import RunConfig
    from ratrain.models import params
    from ratrain.runtime.engine import PipelineEngine
    from ratrain.schedule.plan import build_plan

    torch.set_num_threads(1)
    if args.mode == "plain":
        params.HEAD_CHUNK_ELEMENTS = 1 << 62  # no micro-batch exceeds a chunk
    cfg = RunConfig()
    m, t = cfg.model, cfg.train
    m.name, m.vocab_size, m.dim, m.n_layers, m.n_heads = "bench", args.vocab, args.dim, args.layers, 8
    m.ffn_dim, m.max_seq_len = 688, args.seq_len
    t.seq_len, t.micro_batch_size, t.global_batch = args.seq_len, args.micro_batch_size, 2 * args.micro_batch_size
    plan = build_plan(m.n_layers, 1, 1, 2)
    engine = PipelineEngine(cfg, plan, None, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, m.vocab_size, (t.global_batch, t.seq_len + 1), generator=g)
    batches = list(zip(w[:, :-1].split(t.micro_batch_size), w[:, 1:].split(t.micro_batch_size)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times, losses = [], []
    for step in range(args.steps):
        start = time.perf_counter()
        losses.append(engine.train_step(batches, 1e-3, step).loss)
        times.append(time.perf_counter() - start)
    return {"mode": args.mode, "chunked": params.chunks(t.seq_len * t.micro_batch_size, m.vocab_size),
            "step_s": statistics.median(times[1:]), "losses": losses,
            "ledger_peak": engine.ledger_peak_bytes(), "ledger_at_peak": engine.ledger_at_peak(),
            "rss_growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="bench/results/head_loss.json")
    p.add_argument("--mode", help=argparse.SUPPRESS)  # a worker's
    args = p.parse_args()
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.steps < 2:
        p.error(f"--steps must be >= 2 (the first step is not timed), got {args.steps}")
    if args.mode:
        print(json.dumps(worker(args)))
        return
    runs = {"plain": [], "chunked": []}
    for _ in range(args.rounds):
        for mode in runs:
            cmd = [sys.executable, __file__, "--mode", mode] + [
                f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                if k not in ("mode", "out", "rounds")]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {"chunked": [r["chunked"] for r in runs["chunked"]][0]}
    for key in ("step_s", "ledger_peak", "rss_growth"):
        plain = statistics.median(r[key] for r in runs["plain"])
        chunked = statistics.median(r[key] for r in runs["chunked"])
        summary[key] = {"plain": plain, "chunked": chunked, "chunked / plain": chunked / plain}
    summary["max loss difference"] = max(abs(a - b) for r, s in zip(runs["plain"], runs["chunked"])
                                         for a, b in zip(r["losses"], s["losses"]))
    result = {"machine": machine(), "args": vars(args), "runs": runs, "summary": summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
