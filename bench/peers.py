"""What the benchmarks share: the torch peers a user would pick instead of ratrain, and the
machine description and summary statistics of their JSON.

The peers train ratrain's own units (`build_units(cfg.model, seed, indices)`, so the same initial
weights), with one `torch.optim.AdamW` per rank carrying ratrain's settings (fused=True, weight
decay on matrices only) and a constant learning rate (train.lr), and end each step with an
all_reduce of (loss sum, micro-batch count) over the pipeline group and then the replica group:
the counterpart of ratrain's end-of-step `E` action, so every rank knows the step's mean loss.

* `DDPPeer` (pp = 1): `DistributedDataParallel` over the whole model, `no_sync` for every
  micro-batch but the last, each micro-batch loss x 1/n_micro, then `clip_grad_norm_`.
* `FSDP2Peer` (pp = 1): `fully_shard` (FSDP2) on every ratrain unit and on the whole model over
  the replicas, gradient sync on the last micro-batch only (ratrain's default gradient lifetime
  `step`: accumulated, reduce-scattered once), each micro-batch loss x 1/n_micro, then
  `clip_grad_norm_`; the learning rate is the caller's (bench/fsdp.py passes ratrain's schedule).
  bench/gpu_offload.py adds fully_shard's policies (CPU offload, mixed precision), activation
  checkpointing per decoder block, and gradient sync on every micro-batch (with CPU offload an
  unsynced gradient stays unsharded on the GPU, a whole fp32 model's worth over the step).
* `PipelinePeer` (pp >= 1): `torch.distributed.pipelining`'s `PipelineStage` (static shapes) +
  `Schedule1F1B(loss_fn=lm_loss)` (default scale_grads=True: gradients / n_micro). With dp > 1
  the replicas' gradients are averaged either by wrapping the stage module in DDP over the
  replica group (sync="ddp", as torchtitan does: PipelineStage runs every backward but the last
  under `no_sync`, so DDP's bucketed all-reduce runs inside the last micro-batch's backward) or
  by one flat all_reduce after the schedule (sync="allreduce"). Clipping: the local squared
  norm, all_reduced over the pipeline group, then clip_grad_norm_'s coefficient
  min(1, clip / (norm + 1e-6)).
  Another schedule class may replace Schedule1F1B: a multi-stage one (e.g.
  `ScheduleInterleavedZeroBubble`) gets a list of this rank's one stage. A zero-bubble schedule
  splits the backward, and its weight half (`stage_backward_weight`: torch.autograd.grad) skips
  DDP's gradient hooks, so DDP would average stage 0's replicas only: use sync="allreduce" there.

Bench scripts import this module as `peers` (their own directory is on sys.path when run as
`python bench/<script>.py` or under torchrun).
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from ratrain.config import RunConfig, TrainConfig
from ratrain.models.llama import DecoderBlock, build_units, lm_loss


def machine() -> dict:
    model = platform.processor()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    gpu = {"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}
    return {"nproc": os.cpu_count(), "cpu": model, "machine": platform.machine(),
            "torch": torch.__version__, "python": platform.python_version(), **gpu}


def tokens_per_s(step_times_s: list[float], tokens_per_step: int) -> float:
    """A run's rate over its steps after the first (which pays for warm-up allocations)."""
    timed = step_times_s[1:]
    return tokens_per_step * len(timed) / sum(timed)


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def adamw(params: list[nn.Parameter], t: TrainConfig) -> torch.optim.AdamW:
    """ratrain's make_optimizer settings over all of a rank's parameters: weight decay on
    matrices only, fused=True (the same per-tensor arithmetic as ratrain's per-unit AdamWs)."""
    return torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=t.lr, betas=(t.beta1, t.beta2), eps=t.adam_eps, fused=True,
    )


def _reduce_loss(total: torch.Tensor, groups) -> float:
    """total = [loss sum, micro-batch count] on this rank -> the step's mean loss on every rank."""
    if groups.grid.pp > 1:
        dist.all_reduce(total, group=groups.pipeline)
    if groups.grid.dp > 1:
        dist.all_reduce(total, group=groups.replicas)
    return float(total[0] / total[1])


class DDPPeer:
    """pp = 1: DistributedDataParallel over the whole model (all units), AdamW."""

    description = "torch DistributedDataParallel"

    def __init__(self, cfg: RunConfig, groups, clip: float, bucket_cap_mb: float = 25.0):
        self.groups = groups
        self.clip = clip
        self.module = nn.Sequential(*build_units(cfg.model, cfg.train.seed))
        self.ddp = nn.parallel.DistributedDataParallel(self.module, process_group=groups.replicas,
                                                       bucket_cap_mb=bucket_cap_mb)
        self.params = list(self.module.parameters())
        self.optimizer = adamw(self.params, cfg.train)
        self.description = (f"torch DistributedDataParallel over the replicas (bucket_cap_mb "
                            f"{bucket_cap_mb:g}; no_sync for all but the last micro-batch), "
                            f"clip_grad_norm_ {'(max norm %g)' % clip if clip > 0 else 'off'}, AdamW")

    def train_step(self, batches) -> float:
        return _accumulated_step(
            self, batches, self.ddp,
            lambda last: nullcontext() if last else self.ddp.no_sync())


class FSDP2Peer:
    """pp = 1: FSDP2 over the replicas, AdamW on the sharded (DTensor) parameters."""

    def __init__(self, cfg: RunConfig, groups, clip: float, *, checkpoint_blocks: bool = False,
                 sync_every_micro_batch: bool = False, **fsdp_kwargs):
        """`fsdp_kwargs`: more arguments of every fully_shard (offload_policy, mp_policy)."""
        # Imported here so that a torch without FSDP2 fails this peer only, with its own error.
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        self.groups = groups
        self.clip = clip
        self.sync_every = sync_every_micro_batch
        units = build_units(cfg.model, cfg.train.seed)
        if checkpoint_blocks:  # inside fully_shard, as torchtitan applies it
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                checkpoint_wrapper)
            units = [checkpoint_wrapper(u) if isinstance(u, DecoderBlock) else u for u in units]
        self.module = nn.Sequential(*units)
        mesh = DeviceMesh.from_group(groups.replicas, groups.device.type)
        # One FSDP group per unit, as ratrain shards and gathers per unit (and torchtitan wraps
        # per block); the root holds nothing after that and only drives the hooks.
        for unit in self.module:
            fully_shard(unit, mesh=mesh, **fsdp_kwargs)
        fully_shard(self.module, mesh=mesh, **fsdp_kwargs)
        self.params = list(self.module.parameters())
        self.optimizer = adamw(self.params, cfg.train)  # p.dim() of a DTensor is the full tensor's
        extra = "".join(f", {v}" for v in fsdp_kwargs.values())
        self.description = (f"torch FSDP2 fully_shard per unit and on the model over {groups.grid.dp} "
                            f"replicas{extra} (gradient sync on "
                            f"{'every' if self.sync_every else 'the last'} micro-batch"
                            f"{'; activation checkpointing per decoder block' if checkpoint_blocks else ''}), "
                            f"clip_grad_norm_ {'(max norm %g)' % clip if clip > 0 else 'off'}, AdamW")

    def train_step(self, batches, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return _accumulated_step(self, batches, self.module, self._syncing)

    def _syncing(self, last: bool):
        self.module.set_requires_gradient_sync(last or self.sync_every)
        return nullcontext()


def _accumulated_step(peer, batches, model, syncing) -> float:
    """One step of a data-parallel peer: each micro-batch's loss x 1/n backward inside
    `syncing(last micro-batch)` (the replicas' gradients are reduced on the last one only),
    then clip_grad_norm_, AdamW, and the step's mean loss over the pipeline and replicas."""
    n = len(batches)
    losses = []
    for i, (x, y) in enumerate(batches):
        with syncing(i == n - 1):
            loss = lm_loss(model(x), y)
            (loss / n).backward()
        losses.append(loss.detach())
    if peer.clip > 0:
        nn.utils.clip_grad_norm_(peer.params, peer.clip)
    peer.optimizer.step()
    peer.optimizer.zero_grad(set_to_none=True)
    count = torch.tensor(float(n), device=losses[0].device)  # the losses' device: a GPU's too
    return _reduce_loss(torch.stack([torch.stack(losses).sum(), count]),
                        peer.groups)


def _splits_backward(schedule) -> bool:
    """Whether a schedule runs weight gradients as actions of their own (W: zero bubble)."""
    order = getattr(schedule, "pipeline_order", {})  # multi-stage schedules only
    return any(a is not None and a.computation_type == "W" for acts in order.values() for a in acts)


class PipelinePeer:
    """A torch pipeline schedule (Schedule1F1B by default) over this stage's ratrain units;
    replicas synchronized by DDP or all_reduce."""

    def __init__(self, cfg: RunConfig, stage_units: range, groups, clip: float = 0.0,
                 sync: str = "ddp", bucket_cap_mb: float = 25.0, schedule=Schedule1F1B):
        if sync not in ("ddp", "allreduce"):
            raise ValueError(f"sync must be 'ddp' or 'allreduce', got {sync!r}")
        pp, dp = groups.grid.pp, groups.grid.dp
        self.groups = groups
        self.clip = clip
        self.stage_index = groups.stage
        self.is_last = groups.stage == pp - 1
        self.sync = sync if dp > 1 else "none"
        self.module = nn.Sequential(*build_units(cfg.model, cfg.train.seed, list(stage_units)))
        submod: nn.Module = self.module
        if self.sync == "ddp":
            submod = nn.parallel.DistributedDataParallel(self.module, process_group=groups.replicas,
                                                         bucket_cap_mb=bucket_cap_mb)
        t, m = cfg.train, cfg.model
        mbs, seq = t.micro_batch_size, t.seq_len
        # Static stage metadata; float activations require grad (the metadata records it, and
        # without it the next stage would send no input gradient back).
        example_in = (torch.zeros(mbs, seq, dtype=torch.long) if groups.stage == 0
                      else torch.zeros(mbs, seq, m.dim, requires_grad=True))
        example_out = torch.zeros(mbs, seq, m.vocab_size if self.is_last else m.dim,
                                  requires_grad=True)
        stage = PipelineStage(submod, groups.stage, pp, groups.device,
                              input_args=example_in, output_args=example_out,
                              group=groups.pipeline)
        # Multi-stage schedules take the list of this rank's stages: here one.
        stages = stage if issubclass(schedule, PipelineScheduleSingle) else [stage]
        self.schedule = schedule(stages, n_microbatches=cfg.n_micro, loss_fn=lm_loss,
                                 scale_grads=True)
        self.params = list(self.module.parameters())
        self.optimizer = adamw(self.params, t)
        how = {"ddp": f"stage modules wrapped in DistributedDataParallel over the replicas "
                      f"(bucket_cap_mb {bucket_cap_mb:g}; PipelineStage runs all but the last "
                      f"backward under no_sync)",
               "allreduce": "one flat all_reduce of the stage's gradients over the replicas "
                            "after the schedule",
               "none": "no data parallelism"}[self.sync]
        if self.sync == "allreduce" and _splits_backward(self.schedule):
            how += (" (not DDP: the split weight backward, torch.autograd.grad, skips DDP's "
                    "gradient hooks, so DDP would average stage 0 only)")
        layout = "" if stages is stage else ", one stage per rank"
        self.description = (f"torch.distributed.pipelining {schedule.__name__}{layout}; {how}; "
                            f"global-norm clipping {'(max norm %g)' % clip if clip > 0 else 'off'}; "
                            f"AdamW")

    def _allreduce_grads(self) -> None:
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.groups.replicas)
        flat.div_(self.groups.grid.dp)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _clip(self) -> None:
        # ratrain's N action: per-tensor norms, summed squares over the pipeline, one coefficient.
        norms = torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float32)
                             for p in self.params if p.grad is not None])
        sq = torch.sum(norms * norms).reshape(1)
        if self.groups.grid.pp > 1:
            dist.all_reduce(sq, group=self.groups.pipeline)
        coef = min(1.0, self.clip / (float(sq.sqrt()) + 1e-6))
        for p in self.params:
            p.grad.mul_(coef)

    def train_step(self, batches) -> float:
        if self.stage_index == 0:
            x = torch.cat([b[0] for b in batches])  # split back into the same micro-batches
            self.schedule.step(x, return_outputs=False)
            total = torch.zeros(2)
        elif self.is_last:
            y = torch.cat([b[1] for b in batches])
            losses: list[torch.Tensor] = []
            self.schedule.step(target=y, losses=losses, return_outputs=False)
            total = torch.stack([torch.stack(losses).sum().detach(), torch.tensor(float(len(losses)))])
        else:
            self.schedule.step(return_outputs=False)
            total = torch.zeros(2)
        if self.sync == "allreduce":
            self._allreduce_grads()
        if self.clip > 0:
            self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return _reduce_loss(total, self.groups)
