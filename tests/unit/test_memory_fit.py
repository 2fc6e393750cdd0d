"""setup/memory_fit.py: the plan's predicted bytes against a machine's memory, per stage on a
GPU, summed over the ranks that share a host."""

from __future__ import annotations

from ratrain.config import RunConfig
from ratrain.models.presets import get_preset
from ratrain.schedule.plan import build_plan
from ratrain.setup.memory_fit import StageBytes, memory_refusal

GB = 10**9  # as the messages say sizes

STATE = {"masters": 4 * GB, "gradients": 4 * GB, "optimizer": 8 * GB, "activations": GB}


def _cfg() -> RunConfig:
    cfg = RunConfig()
    cfg.model = get_preset("llama2-7b")
    return cfg


def _stages(device: list[float], host: list[float]) -> list[StageBytes]:
    return [StageBytes(int((d + h) * GB), int(d * GB), int(h * GB), STATE, STATE)
            for d, h in zip(device, host)]


def test_a_gpu_stage_over_the_device_is_named_with_what_lowers_it():
    plan = build_plan(4, 2, 1, 4)
    why = memory_refusal(_cfg(), plan, _stages([30, 90], [0, 0]), local_ranks=[0, 1],
                         host_available=500 * GB, device_bytes=80 * GB, host_is_separate=True)
    assert why.startswith("this run does not fit the GPU: stage 1 would hold about 90.00 GB")
    assert "the GPU has 80.00 GB" in why and "--state-home host" in why
    assert memory_refusal(_cfg(), plan, _stages([30, 80], [0, 0]), local_ranks=[0, 1],
                          host_available=500 * GB, device_bytes=80 * GB,
                          host_is_separate=True) is None


def test_host_memory_is_summed_over_this_nodes_ranks_only():
    """pp 2 x dp 2 under torchrun, two ranks a node: node 1 holds ranks 2 and 3, both stage 1
    (pp-dp order), so its host must hold two of stage 1's host state, not stage 0's."""
    plan = build_plan(4, 2, 2, 4)
    stages = _stages([5, 5], [10, 30])
    fits = dict(host_available=61 * GB, device_bytes=80 * GB, host_is_separate=True)
    assert memory_refusal(_cfg(), plan, stages, local_ranks=[0, 1], **fits) is None
    assert memory_refusal(_cfg(), plan, stages, local_ranks=[2, 3], **fits) is None
    fits["host_available"] = 59 * GB
    assert memory_refusal(_cfg(), plan, stages, local_ranks=[0, 1], **fits) is None
    why = memory_refusal(_cfg(), plan, stages, local_ranks=[2, 3], **fits)
    assert why.startswith("this run does not fit this machine's host memory: its 2 ranks here "
                          "would hold about 60.00 GB"), why
    assert "--shard-state" in why  # dp 2, whole state on each replica


def test_on_a_cpu_a_ranks_whole_peak_counts_and_unknown_memory_passes():
    plan = build_plan(4, 1, 1, 4)
    stages = _stages([20], [0])
    assert memory_refusal(_cfg(), plan, stages, local_ranks=[0], host_available=None,
                          device_bytes=None, host_is_separate=False) is None
    why = memory_refusal(_cfg(), plan, stages, local_ranks=[0], host_available=19 * GB,
                         device_bytes=None, host_is_separate=False)
    assert "its rank here would hold about 20.00 GB (optimizer 8.00 GB" in why
    assert "--shard-state" not in why and "smaller model" in why


def test_a_containers_memory_limit_bounds_what_is_available(tmp_path, monkeypatch):
    """Inside a memory-limited cgroup MemAvailable is the host's: the limit less the working
    set (usage less inactive file cache) is what the run may hold; v2, v1, and no limit."""
    from ratrain import host_memory
    from ratrain.host_memory import available_host_bytes

    assert host_memory._meminfo_available() > 0  # this machine's, read
    host = 100 * GB  # (fixed: MemAvailable moves while other tests run)
    monkeypatch.setattr(host_memory, "_meminfo_available", lambda: host)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{8 * GB}\n")
    (v2 / "memory.current").write_text(f"{5 * GB}\n")
    (v2 / "memory.stat").write_text(f"anon 123\ninactive_file {GB}\nactive_file 7\n")
    assert available_host_bytes(v2) == 4 * GB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{2 * GB}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{3 * GB}\n")
    (v1 / "memory" / "memory.stat").write_text(f"total_inactive_file {2 * GB}\n")
    assert available_host_bytes(v1) == GB
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v2 / "memory.max").write_text("max\n")
    assert available_host_bytes(v1) == available_host_bytes(v2) == host
    assert available_host_bytes(tmp_path / "none") == host


def test_an_outer_sync_is_weighed_at_its_synced_step():
    """Under --sync diloco the steps that sync also hold the deltas in flight (in host memory,
    with the state there): the check weighs the largest of the inner and the synced steps, not
    the plan's inner programs alone."""
    from ratrain.schedule.outer_sync import step_programs
    from ratrain.setup.memory_fit import stage_bytes
    from ratrain.sim.cost_model import StageCosts
    from ratrain.sim.placement import stage_setups
    from ratrain.sim.profile import load_profile
    from ratrain.sim.stage_memory import StageMemory

    cfg = _cfg()
    cfg.train.seq_len, cfg.train.micro_batch_size, cfg.train.dtype = 1024, 1, "bfloat16"
    profile = load_profile("h100-80g-ib")
    t = cfg.train
    # diloco:3 syncs in step 2 (after 3 inner steps); streaming diloco:4:2 a fragment in
    # steps 4 and 6, none before the first period ends (until 2026-11-27 the check looked in
    # the first period only, and weighed no synced step of a streaming run)
    for sync, steps in (("diloco:3", (2,)), ("diloco:4:2", (4, 6))):
        plan = build_plan(cfg.model.n_layers, 1, 2, 2, sync=sync, state_home="host",
                          view_window=1, activation="recompute")
        costs = StageCosts(stage_setups(plan, cfg.model, profile,
                                        micro_batch_size=t.micro_batch_size, seq_len=t.seq_len,
                                        dtype=t.dtype)[0])
        inner = StageMemory(costs, plan.programs[0], False).host_peak
        synced = max(StageMemory(costs, step_programs(plan, step)[0], False).host_peak
                     for step in steps)
        assert synced > inner, sync
        weighed = stage_bytes(cfg, plan, profile)[0]
        assert weighed.host == synced, sync
        # by kind at the device's own peak: no host-homed state among them, the device's sum
        assert sum(weighed.at_device_peak.values()) == weighed.device, sync
        assert weighed.at_device_peak["optimizer"] == 0 < weighed.at_peak["optimizer"], sync


def test_a_gpu_refusal_lists_what_is_on_the_device_not_the_host_state():
    stages = [StageBytes(int(120 * GB), int(90 * GB), int(30 * GB),
                         {**STATE, "views": 2 * GB},
                         {"views": 2 * GB, "activations": GB, "masters": 0})]
    why = memory_refusal(_cfg(), build_plan(4, 1, 1, 4, state_home="host", view_window=1),
                         stages, local_ranks=[0], host_available=500 * GB,
                         device_bytes=80 * GB, host_is_separate=True)
    assert "would hold about 90.00 GB on it (views 2.00 GB, activations 1.00 GB)" in why, why
