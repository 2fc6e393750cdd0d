"""The host update of a unit whose gradient accumulates in bf16 (--host-grad-dtype bfloat16,
runtime/host_grad.py) against the same unit's with an fp32 accumulation, in one process:
UnitState.update of each in turn (clipping coefficient given, as with the global norm), rounds
alternating; the median time of the rounds after the first, and the ratio. The unit is a
llama block's parameters at `--dim` / `--ffn` (2048 / 5504: 50M parameters). Both ways the
update runs: as a GPU's host runs it (`host_for_gpu`: the fused AdamW scales the gradient as it
reads it, the zeroing left to the next fold; run here on the CPU as the tests run it) and as a
CPU-only run does (a scaling pass, then AdamW, then the zeroing).

    python bench/host_grad_update.py [--dim 2048] [--ffn 5504] [--rounds 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

from ratrain.runtime.host_grad import update_scratch  # noqa: E402
from ratrain.runtime.state_layout import Replicated  # noqa: E402
from ratrain.runtime.unit_state import UnitState  # noqa: E402


def block_state(dim: int, ffn: int, grad_dtype: torch.dtype) -> UnitState:
    shapes = [(dim, dim)] * 4 + [(ffn, dim), (ffn, dim), (dim, ffn), (dim,), (dim,)]
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    state = UnitState(params, lambda ps, decay=None: torch.optim.AdamW(ps, lr=1e-4, fused=True),
                      Replicated(torch.device("cpu"), grad_dtype), view_dtype=torch.bfloat16)
    state.update_scratch = update_scratch(state.sizes) if grad_dtype != torch.float32 else None
    return state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5504)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error(f"--rounds must be >= 2 (the first round is left out of the medians), "
                 f"got {args.rounds}")
    result = {"machine": machine(), "threads": torch.get_num_threads(),
              "command": " ".join(["python", *sys.argv])}
    real = UnitState._host_homed_on_gpu
    try:
        for path in ("host_for_gpu", "cpu_only"):
            UnitState._host_homed_on_gpu = property(lambda self, on=path == "host_for_gpu": on)
            result[path] = time_updates(args)
            print(f"{path}: {result[path]['params'] / 1e6:.1f}M parameters, "
                  f"{result['threads']} threads: update fp32 "
                  f"{result[path]['median_s']['float32'] * 1e3:.1f} ms, bf16 accumulation "
                  f"{result[path]['median_s']['bfloat16'] * 1e3:.1f} ms "
                  f"({result[path]['bf16_over_fp32']:.2f}x)")
    finally:
        UnitState._host_homed_on_gpu = real
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")


def time_updates(args) -> dict:
    """Each unit's update, alternating, `args.rounds` times: the medians after the first."""
    states = {name: block_state(args.dim, args.ffn, dtype)
              for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    grad = torch.randn(states["float32"].numel) * 1e-3
    times: dict[str, list[float]] = {name: [] for name in states}
    for _ in range(args.rounds):
        for name, state in states.items():
            # the step's first fold: copied over the accumulation (cast to its dtype)
            state._host_fold.fold(state.param_slices(grad), state._accumulation_slices(),
                                  overwrite=True)
            start = time.perf_counter()
            state.update(torch.tensor(0.5))
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t[1:]) for name, t in times.items()}
    return {"params": states["float32"].numel, "median_s": median,
            "bf16_over_fp32": median["bfloat16"] / median["float32"]}


if __name__ == "__main__":
    main()
