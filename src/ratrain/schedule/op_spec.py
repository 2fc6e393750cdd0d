"""The vocabulary of the op registry (schedule/ops.py): the ops, their classes and peers, the
memory effects, and the spec each op has. Pure data: no torch."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Op(str, Enum):
    """The op codes (the text form's prefix); what each does is its spec's `doc`."""

    FORWARD = "F"
    BACKWARD = "B"
    BACKWARD_INPUT = "BI"
    BACKWARD_WEIGHT = "BW"
    RECOMPUTE = "R"
    SEND_ACT = "SA"
    WAIT_SEND_ACT = "WSA"
    RECV_ACT = "RA"
    WAIT_RECV_ACT = "WRA"
    SEND_GRAD = "SG"
    WAIT_SEND_GRAD = "WSG"
    RECV_GRAD = "RG"
    WAIT_RECV_GRAD = "WRG"
    GRAD_SYNC = "GS"
    WAIT_GRAD_SYNC = "WGS"
    GRAD_REDUCE = "RS"
    WAIT_GRAD_REDUCE = "WRS"
    CROSS_SYNC = "GX"
    WAIT_CROSS_SYNC = "WGX"
    GRAD_NORM = "N"
    WAIT_GRAD_NORM = "WN"
    UPDATE = "U"
    START_UPDATE = "SU"
    WAIT_UPDATE = "WU"
    START_NORM = "SN"
    WAIT_NORM = "WSN"
    OFFLOAD = "O"
    RELOAD = "L"
    WAIT_RELOAD = "WL"
    PREFETCH = "P"
    WAIT_PREFETCH = "WP"
    RELEASE = "X"
    STEP_END = "E"
    OUTER_SYNC = "OS"
    WAIT_OUTER_SYNC = "WOS"
    TIED_SYNC = "TS"
    WAIT_TIED_SYNC = "WTS"


class OpClass(str, Enum):
    COMPUTE = "compute"  # runs on the rank's own thread or compute stream (F, R, B, BI, BW, U)
    P2P = "p2p"  # a transfer to or from a neighbouring stage
    COLLECTIVE = "collective"  # over the stage's replicas or the replica's stages
    COPY = "copy"  # between memory tiers, on the copy engine
    STATE = "state"  # bookkeeping of a unit's state: no data moves
    HOST = "host"  # runs on the rank's host update thread, beside the compute (SU)


class Peer(str, Enum):
    PREV = "prev"  # the previous stage
    NEXT = "next"  # the next stage
    REPLICAS = "replicas"  # the stage's data-parallel replicas
    PIPELINE = "pipeline"  # the replica's pipeline stages
    TIED = "tied"  # the replica's other stage holding a copy of a tied weight (first <-> last)


@dataclass(frozen=True)
class Hold:
    """The action's owner `owner` (keyed by the action's unit + `unit_offset` and micro-batch;
    `per_unit`: by the unit alone, so that actions on different micro-batches share it) keeps
    `storages` alive, counted under ledger `kind`."""

    owner: str
    kind: str
    storages: tuple[str, ...]
    unit_offset: int = 0
    per_unit: bool = False


@dataclass(frozen=True)
class Release:
    """That owner lets go of everything it holds."""

    owner: str
    unit_offset: int = 0
    per_unit: bool = False


Effect = Hold | Release


def owner_key(effect: Effect, unit: int | None, mb: int | None) -> tuple:
    u = unit + effect.unit_offset
    return (effect.owner, u) if mb is None or effect.per_unit else (effect.owner, u, mb)


@dataclass(frozen=True)
class OpSpec:
    op: Op
    doc: str
    cls: OpClass
    unit: bool = True  # takes a unit
    mb: bool = True  # takes a micro-batch
    waited_by: Op | None = None  # starts asynchronous work that this op waits for
    peers: tuple[Peer, ...] = ()
    pairs_with: Op | None = None  # p2p: the peer's op that completes the transfer with this one
    sends: bool = False  # p2p: this side sends
    in_eval: bool = False  # may appear in an evaluation (forward-only) program
    eager: bool = False  # goes right after the compute action that produces what it moves
    view: str | None = None  # the unit's view after it: "pending", "live" or "released"
    memory: tuple[Effect, ...] = ()
    input_grad: bool = False  # backward: needs the output gradient, makes the input gradient
    weight_grad: bool = False  # backward: accumulates the unit's parameter gradients
    waits: Op | None = None  # filled in: the start this op waits for
    carried: bool = False  # a start waited in the next step's program, before the unit's use

    @property
    def starts(self) -> bool:
        """Starts asynchronous work that a later action waits for."""
        return self.waited_by is not None

    @property
    def own_unit(self) -> bool:
        """Its unit is one of the stage's own (a transfer names the tensor's producer)."""
        return self.unit and self.cls is not OpClass.P2P

    @property
    def pipeline_collective(self) -> bool:
        """Every stage of the replica must issue it before it can complete."""
        return self.cls is OpClass.COLLECTIVE and Peer.PIPELINE in self.peers
