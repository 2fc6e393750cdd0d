"""What the account of a search that found nothing, and the low-communication advice, say: no
budget above the device's memory is suggested (it is held to the memory, so the same account
came back); the sharding hint says that sharded state lives on the device beside a host-homed
closest plan, and that a dp beyond the devices needs more of them; sizes in decimal units."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ratrain.models.presets import get_preset
from ratrain.planner import account
from ratrain.planner.layouts import PlanRequest
from ratrain.sim import low_comm
from ratrain.sim.profile import load_profile

GPU_PROFILE = (Path(__file__).resolve().parents[2]
               / "bench/results/gpu_2026-11-26b/call1/gpu_profile.yaml")


def _request(profile, budget: float, devices: int, global_batch: int) -> PlanRequest:
    return PlanRequest(model=get_preset("tiny"), profile=profile, devices=devices,
                       global_batch=global_batch, seq_len=256, budget=budget)


def _with_memory(profile, memory: float):
    return dataclasses.replace(profile, device=dataclasses.replace(profile.device,
                                                                   memory_bytes=memory))


def _hint(text: str, start: str) -> str:
    return next(line.strip() for line in text.splitlines() if line.strip().startswith(start))


def test_a_budget_above_the_devices_memory_is_not_suggested():
    """llama2-7b on cpu-local was told "a budget of 120.60 GB per device would fit the closest
    plan" on devices of 11.35 GB; asked for it, the planner held the budget to 11.35 GB and
    said the same again."""
    text = account.account(_request(_with_memory(load_profile("cpu-local"), 20e6), 15e6,
                                    devices=2, global_batch=1))
    assert "would fit the closest plan" not in text, text
    line = _hint(text, "no budget a cpu-local device can give fits the closest plan")
    needed = float(re.search(r"it needs ([0-9.]+) MB", line)[1])
    assert needed > 20 and "the device has 20.00 MB" in line, line
    assert "more devices would not help" in text  # the other hints still follow


def test_a_budget_within_the_devices_memory_is_still_suggested():
    text = account.account(_request(load_profile("cpu-local"), 15e6, devices=2, global_batch=1))
    assert re.search(r"a budget of [0-9.]+ MB per device would fit the closest plan", text), text


def test_beside_a_host_homed_closest_plan_sharding_is_said_to_need_the_device_home():
    """The hint read "even sharded over dp=2" beside a closest plan that keeps its state on the
    host, where no state is sharded."""
    text = account.account(_request(load_profile(str(GPU_PROFILE)), 10e6, devices=8,
                                    global_batch=2))
    assert "state on the host" in _hint(text, "closest:"), text
    line = _hint(text, "one decoder block's training state")
    assert "the closest plan keeps it on the host" in line, line
    assert "--state-home device" in line.split("sharded over dp=")[0], line


def test_a_dp_beyond_the_devices_is_said_to_need_more_of_them():
    """llama2-70b on 8 devices was told "even sharded over dp=16 replicas it takes ..." as if
    16 replicas could run on them."""
    text = account.account(_request(load_profile("cpu-local"), 10e6, devices=2, global_batch=4))
    line = _hint(text, "one decoder block's training state")
    assert "even sharded over dp=4 replicas (dp=4 needs 4 devices, more than the 2)" in line, line
    assert "the closest plan keeps it on the host" not in line  # its state is on the device


def test_the_low_communication_advice_says_bytes_in_decimal_units():
    """It said "2.76e+05 MB per replica every 20 steps"."""
    option = low_comm.Option(sync="diloco:20", every=20, fragments=None, mean_step_s=1.0,
                             hidden=True, bytes_per_period=276_000_000_000, results=[])
    text = low_comm.advice(low_comm.LowComm(step_s=2.0, inner_s=1.0, options=[option]), 1024)
    assert "276.00 GB per replica every 20 steps" in text, text
