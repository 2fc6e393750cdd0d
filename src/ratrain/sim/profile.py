"""Hardware profiles: what a device computes, holds and moves, and how devices are linked (by
links of the alpha-beta model, sim/links.py).

A profile is a YAML file, loaded by preset name (sim/profiles/NAME.yaml) or by path; `ratrain
profile` writes one for the machine it runs on. Every figure is in SI units: bytes, seconds,
FLOP/s, bytes/s. Unknown keys, wrong types and out-of-range values are refused with their path
(`device.memory_bytes: expected a number, got 'lots'`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ratrain.config import ModelConfig
from ratrain.errors import UserError
from ratrain.plain_data import number, parse_error, shown, unknown_keys
from ratrain.sim.links import Link, LinkClass
from ratrain.sim.measured_shapes import MeasuredShape, ModelShape, UnitTimes

PRESET_DIR = Path(__file__).parent / "profiles"


@dataclass
class ComputeRate:
    """Dense math: peak FLOP/s and the fraction of it a model's units achieve."""

    peak_flops: float
    efficiency: float | None = 0.5
    """Of the units' FLOPs outside attention's core (their matrix products and what goes with
    them); all of their FLOPs where `attention_efficiency` is None. None: not measured (a
    profile of another dtype measures this one's peak only), which HardwareProfile.rate
    refuses: another dtype's efficiency priced float32 on a bf16 CPU profile 4x slow."""
    attention_efficiency: float | None = None
    """Of attention's core, softmax(q k^T) v forward and backward (causal: the half it
    computes): its products are one head wide, and run far below the matmul peak on a CPU (0.2
    of it on our 2-core VM, where the rest of a block gets 0.7). None: `efficiency`."""

    @property
    def achieved(self) -> float:
        return self.peak_flops * self.efficiency

    @property
    def attention_achieved(self) -> float:
        return self.peak_flops * (self.attention_efficiency or self.efficiency)


@dataclass
class Device:
    name: str
    memory_bytes: float
    """The per-device budget (usable memory for training)."""
    compute: dict[str, ComputeRate]
    """Per compute dtype: float32, bfloat16, float16."""
    memory_bandwidth: float
    """Bytes/s of elementwise work on the device: optimizer update, norms, gradient folds."""
    host_memory_bandwidth: float | None = None
    """The same on the host tier, where state kept on the host is updated (a GPU's host-homed
    masters: AdamW on the CPU); None: as memory_bandwidth."""
    host_link: Link | None = None
    """Host<->device copies; None where the host memory is the device's memory (a CPU)."""
    host_collectives: bool = True
    """Whether the devices' collectives can reduce buffers in the host tier; False for GPUs,
    whose NCCL reduces device memory only (host-resident state then cannot sum its gradients
    over dp every step; DiLoCo's outer sync of it runs over gloo, priced on the same link)."""
    host_memory_bytes: float | None = None
    """Host-tier memory a device may fill (state kept on the host, offloaded activations):
    its share of its node's; None: not limited (or no host tier)."""
    cores: int | None = None
    """CPU only: cores the ranks of one node share (None: every rank has a device of its own)."""
    node_memory_bytes: float | None = None
    """CPU only: memory one node's devices share (split: planner/node_memory.py); None: unknown."""
    action_overhead_s: float = 0.0
    """The executor's own time per action (Python, bookkeeping)."""
    process_overhead_bytes: float = 0.0
    """What a training process grows by beyond the ledger's peak: allocator caching, autograd's
    transient gradients, communication buffers (measured RSS growth minus ledger peak): a fixed
    part, plus `process_overhead_per_byte` for every byte the ledger grows by in training."""
    process_overhead_per_byte: float = 0.0
    """The part of the process overhead that grows with the stage: allocator fragmentation and
    transients grow with what the stage allocates (the ledger's growth from before the first
    step to its peak)."""

    thread_efficiency: float | None = None
    """CPU: what each thread of a rank beyond its first adds to its speed, as a fraction of one
    thread's: a rank on T of the cores computes 1 + (T - 1) x this times one thread's speed
    (`ratrain profile`: one process alone, its block's forward and backward on one thread and
    on every core). None: 1, every thread a core's worth (the optimistic edge)."""

    contention: float = 0.0
    """CPU: how much slower compute runs while every core of the node is busy than alone
    (shared caches and memory bandwidth), as a fraction: 0.2 = 20% slower. The simulator slows
    a node's compute by 1 + contention x (busy ranks - 1) / (cores - 1), at most the full
    factor, on top of processor sharing. Where `ratrain profile`'s repeats of it disagree, the
    median, with its slowest and fastest repeat in the profile's `unstable`."""

    def process_overhead(self, ledger_growth: float) -> float:
        return self.process_overhead_bytes + self.process_overhead_per_byte * ledger_growth

    @property
    def reduce_scatter_all_reduces(self) -> bool:
        """Whether a reduce-scatter moves an all-reduce's bytes: CPU devices (no host link) run
        gloo, whose reduce-scatter is an all-reduce of the full buffer (runtime/sharded_layout.py);
        NCCL's ring reduce-scatter moves half of that."""
        return self.host_link is None


@dataclass
class DeviceGroup:
    """Devices of one kind in a heterogeneous cluster. Ranks fill the groups in the order they
    are listed: the first `count` ranks are the first group's."""

    name: str
    count: int
    device: Device


@dataclass
class HardwareProfile:
    name: str
    description: str
    device: Device
    devices_per_node: int
    intra_node: LinkClass
    inter_node: LinkClass
    measured: list[MeasuredShape] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)
    """Where each assumed figure comes from (key: the figure's path)."""
    groups: list[DeviceGroup] = field(default_factory=list)
    """A heterogeneous cluster: groups of devices that differ in speed and memory (`device` is
    then the first group's). Empty: every device is `device`."""
    unstable: dict[str, dict[str, float]] = field(default_factory=dict)
    """The figures that did not repeat over `ratrain profile`'s repeats (the profile holds each at
    its median), at their slowest and fastest repeat: {"slow": {field path: value}, "fast":
    {...}} (sim/profile_repeats.py, at_edge): `ratrain simulate` and `ratrain plan` state the
    step time at both. Empty: every figure repeated, or a preset."""

    @property
    def device_count(self) -> int | None:
        """How many devices the groups have (None: as many as asked for)."""
        return sum(g.count for g in self.groups) if self.groups else None

    def group_of_rank(self, rank: int) -> int:
        """Index of the group a global rank's device belongs to (0 without groups)."""
        for i, g in enumerate(self.groups):
            if rank < g.count:
                return i
            rank -= g.count
        if self.groups:
            raise UserError(f"profile {self.name}: rank {rank} is beyond its "
                            f"{self.device_count} devices")
        return 0

    def for_group(self, index: int) -> HardwareProfile:
        """This profile as if every device were group `index`'s."""
        if not self.groups:
            return self
        return dataclasses.replace(self, device=self.groups[index].device, groups=[])

    def link(self, same_node: bool) -> LinkClass:
        return self.intra_node if same_node else self.inter_node

    def rate(self, dtype: str) -> ComputeRate:
        if dtype not in self.device.compute:
            known = ", ".join(self.device.compute)
            raise UserError(f"profile {self.name} has no compute rate for {dtype}; it knows "
                            f"{known}: measure {dtype} on the machine with `ratrain profile "
                            f"--dtype {dtype}`, or run in "
                            + (f"--dtype {known}" if len(self.device.compute) == 1
                               else f"one it knows (--dtype {next(iter(self.device.compute))})"))
        rate = self.device.compute[dtype]
        if rate.efficiency is None:
            raise UserError(f"profile {self.name} measured {dtype}'s peak but not its "
                            f"efficiency: profile it with `ratrain profile --dtype {dtype}`")
        return rate

    def measured_for(self, model: ModelConfig, seq_len: int, micro_batch_size: int,
                     dtype: str) -> MeasuredShape | None:
        for m in self.measured:
            if (m.seq_len, m.micro_batch_size, m.dtype) == (seq_len, micro_batch_size, dtype) \
                    and m.is_of(model):
                return m
        return None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_profile(spec: str | Path) -> HardwareProfile:
    """A preset by name, or a profile YAML file by path."""
    path = Path(spec)
    if not path.is_file():
        if str(spec) not in presets():
            raise UserError(f"no hardware profile {str(spec)!r}: not a file, and not one of the "
                            f"presets {', '.join(presets())}")
        path = PRESET_DIR / f"{spec}.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"cannot parse profile {path}: {parse_error(e)}") from None
    return from_dict(data, str(path))


def from_dict(data: Any, where: str = "profile") -> HardwareProfile:
    if isinstance(data, dict) and "device" not in data and isinstance(data.get("groups"), list) \
            and data["groups"] and isinstance(data["groups"][0], dict) and "device" in data["groups"][0]:
        data = {**data, "device": data["groups"][0]["device"]}  # a cluster of groups
    return _build(HardwareProfile, data, "", where)


def _build(cls, data: Any, path: str, where: str):
    """`cls` from plain data, each field checked against its annotation."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: {path or 'the profile'}: expected a mapping, got {shown(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = unknown_keys(data, fields)
    if unknown:
        raise UserError(f"{where}: {_join(path, unknown[0])}: unknown key (known: {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise UserError(f"{where}: {_join(path, name)}: missing")
            continue
        values[name] = _value(_TYPES[cls][name], data[name], _join(path, name), where)
    return cls(**values)


def _value(kind, value: Any, path: str, where: str):
    if isinstance(kind, tuple):  # (container, item kind)
        container, item = kind
        if container is list:
            if not isinstance(value, list):
                raise UserError(f"{where}: {path}: expected a list, got {shown(value)}")
            return [_value(item, v, f"{path}[{i}]", where) for i, v in enumerate(value)]
        if not isinstance(value, dict):
            raise UserError(f"{where}: {path}: expected a mapping, got {shown(value)}")
        if not value and path.split(".")[-1] in _NOT_EMPTY:
            raise UserError(f"{where}: {path}: {_NOT_EMPTY[path.split('.')[-1]]}")
        return {str(k): _value(item, v, _join(path, str(k)), where) for k, v in value.items()}
    if kind in _OPTIONAL:
        return None if value is None else _value(_OPTIONAL[kind], value, path, where)
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, path, where)
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {path}: expected true or false, got {shown(value)}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: {path}: expected a string, got {shown(value)}")
        return value
    try:
        value = number(value, whole=kind is int)
    except ValueError as e:
        raise UserError(f"{where}: {path}: {e}") from None
    if value < 0 or (value == 0 and (path.split(".")[-1] in _POSITIVE
                                     or ".".join(path.split(".")[-2:]) in _POSITIVE_HALVES)):
        raise UserError(f"{where}: {path}: must be {'positive' if value == 0 else '>= 0'}, got {value!r}")
    most = _AT_MOST.get(path.split(".")[-1])
    if most is not None and value > most:
        raise UserError(f"{where}: {path}: must be at most {most}, got {value!r}")
    return value


_POSITIVE = {"bandwidth", "peak_flops", "efficiency", "attention_efficiency", "memory_bytes",
             "memory_bandwidth", "host_memory_bandwidth", "devices_per_node", "cores", "seq_len",
             "micro_batch_size", "count", "vocab_size", "dim", "n_heads", "n_kv_heads", "ffn_dim",
             "forward_s", "backward_s", "block_forward_no_grad_s", "node_memory_bytes"}
# Not the embedding's BI (its input is token ids), nor a chunked head's BW (its BI runs the
# whole backward): sim/unit_costs.split_backward_s prices both at 0.
_POSITIVE_HALVES = {"block.backward_input_s", "block.backward_weight_s", "head.backward_input_s",
                    "embedding.backward_weight_s"}
_NOT_EMPTY = {"compute": "empty: give at least one dtype's rate (float32: {peak_flops: ..., "
                         "efficiency: ...}), or measure one with `ratrain profile`"}
# A thread adds at most a thread's speed. A compute efficiency is of a measured matmul's peak,
# which the units' own products beat on a busy CPU (by up to 12% in profiles of the 2-core VM:
# 1.12); twice it says the peak is wrong. (Contention and process_overhead_per_byte are a
# slowdown and a growth: no bound above.)
_AT_MOST = {"thread_efficiency": 1, "efficiency": 2, "attention_efficiency": 2}

_OPTIONAL = {"optional-link": Link, "optional-int": int, "optional-float": float,
             "optional-model": ModelShape}

_TYPES = {
    Link: {"bandwidth": float, "latency": float},
    LinkClass: {"p2p": Link, "collective": Link},
    ComputeRate: {"peak_flops": float, "efficiency": "optional-float",
                  "attention_efficiency": "optional-float"},
    UnitTimes: {"forward_s": float, "backward_s": float, "backward_input_s": "optional-float",
                "backward_weight_s": "optional-float"},
    MeasuredShape: {"model": str, "seq_len": int, "micro_batch_size": int, "dtype": str,
                    "embedding": UnitTimes, "block": UnitTimes, "head": UnitTimes,
                    "block_forward_no_grad_s": "optional-float", "model_shape": "optional-model"},
    ModelShape: {"vocab_size": int, "dim": int, "n_heads": int, "n_kv_heads": int, "ffn_dim": int,
                 "position": str, "qkv_bias": bool, "tie_embeddings": bool, "norm_head": bool},
    Device: {"name": str, "memory_bytes": float, "compute": (dict, ComputeRate), "cores":
             "optional-int", "memory_bandwidth": float, "host_memory_bandwidth": "optional-float",
             "host_link": "optional-link", "host_memory_bytes": "optional-float", "contention":
             float, "host_collectives": bool, "node_memory_bytes": "optional-float",
             "action_overhead_s": float, "thread_efficiency": "optional-float",
             "process_overhead_bytes": float, "process_overhead_per_byte": float},
    DeviceGroup: {"name": str, "count": int, "device": Device},
    HardwareProfile: {"name": str, "description": str, "device": Device, "devices_per_node": int,
                      "intra_node": LinkClass, "inter_node": LinkClass,
                      "measured": (list, MeasuredShape), "notes": (dict, str),
                      "groups": (list, DeviceGroup), "unstable": (dict, (dict, float))},
}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
