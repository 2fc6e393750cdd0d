"""The FSDP2 CPU-offload peer of bench/gpu_offload.py: one run at one micro-batch size, in a
process of its own (a CUDA OOM leaves FSDP2's state half-way; a fresh process does not).

    python bench/gpu_offload_peer.py SPEC.json   # {cfg, device, budget, store, out}: JSON to out
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

from ratrain.config import RunConfig
from ratrain.data.replica import make_data
from ratrain.data.tokenizer import load_tokenizer
from ratrain.runtime.optim import lr_at
from ratrain.schedule.grid import RankGrid

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import FSDP2Peer  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="the run's JSON spec, as bench/gpu_offload.py writes it: "
                                 "{cfg, device, budget, store, out}")
    spec = json.loads(Path(ap.parse_args(argv).spec).read_text())
    cfg = RunConfig.from_dict(spec["cfg"])
    t, device = cfg.train, torch.device(spec["device"])
    cuda = device.type == "cuda"
    if cuda:
        device = torch.device("cuda", device.index or 0)  # set_device refuses a bare "cuda"
        torch.cuda.set_device(device)
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, spec["budget"] / total), device)
    # gloo beside NCCL: clip_grad_norm_ all-reduces the norm of the offloaded (CPU) gradients
    # (pytorch#148532; torchtitan and torchtune do the same)
    dist.init_process_group("cuda:nccl,cpu:gloo" if cuda else "gloo",
                            init_method=f"file://{spec['store']}", rank=0, world_size=1)
    groups = SimpleNamespace(replicas=dist.group.WORLD, device=device, grid=RankGrid(1, 1))
    loader, _ = make_data(cfg, load_tokenizer(cfg.data.tokenizer), 1, 0)
    peer = FSDP2Peer(cfg, groups, t.grad_clip, checkpoint_blocks=True, sync_every_micro_batch=True,
                     offload_policy=CPUOffloadPolicy(pin_memory=cuda),
                     mp_policy=MixedPrecisionPolicy(param_dtype=getattr(torch, t.dtype),
                                                    reduce_dtype=torch.float32))
    out = {"micro_batch_size": t.micro_batch_size, "description": peer.description, "pinned": cuda,
           "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
           "losses": [], "step_times_s": []}
    try:
        for step in range(t.steps):
            batches = [(x.to(device), y.to(device)) for x, y in loader.step_batches(step)]
            t0 = time.perf_counter()
            out["losses"].append(peer.train_step(batches, lr_at(step, t)))  # ends synchronized
            out["step_times_s"].append(time.perf_counter() - t0)
            # each step's, where a caller's time limit cuts the run (bench/gpu_offload.py
            # reports it); the finished run's below
            steps = Path(spec["out"] + ".steps.tmp")  # whole, or not at all, when read
            steps.write_text(json.dumps(out))
            steps.replace(spec["out"] + ".steps")
    except torch.cuda.OutOfMemoryError as e:
        out["oom"] = f"step {step + 1}: {str(e).splitlines()[0]}"
    if cuda:
        out["peak_cuda_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_cuda_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    Path(spec["out"]).write_text(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
