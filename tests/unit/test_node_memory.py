"""A CPU node's memory is its devices' to share: a measured CPU profile records it
(device.node_memory_bytes), and a search or simulation of N devices holds each to its share, as
the search without --profile shares this machine's (a --ranks 1 profile gave each of 2 devices
the whole RAM: pp=2 planned 27.4 GB on a machine of 25.3 GB, "fits: yes")."""

from __future__ import annotations

import json

import pytest
import yaml

from ratrain.errors import UserError
from ratrain.sim.profile import load_profile

from .cli_runner import run_cli

NODE = 30e9


def _cpu_profile(tmp_path, node_memory: float | None = NODE, **device):
    """cpu-local as `ratrain profile --ranks 1` writes one: each device the node's memory."""
    data = load_profile("cpu-local").to_dict()
    data["device"].update({"memory_bytes": NODE, **device})
    if node_memory is not None:
        data["device"]["node_memory_bytes"] = node_memory
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_profile_loads_its_node_memory_and_refuses_a_bad_one(tmp_path):
    assert load_profile(_cpu_profile(tmp_path)).device.node_memory_bytes == NODE
    assert load_profile(_cpu_profile(tmp_path, None)).device.node_memory_bytes is None
    with pytest.raises(UserError, match="device.node_memory_bytes: must be positive"):
        load_profile(_cpu_profile(tmp_path, 0))


@pytest.mark.parametrize("devices", [1, 2, 3])
def test_the_search_shares_the_nodes_memory_among_the_devices_searched(
        monkeypatch, capsys, tmp_path, devices):
    out = tmp_path / "plan.json"
    code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                                   str(_cpu_profile(tmp_path)), "--devices", str(devices),
                                   "--top", "1", "--out", str(out))
    assert code == 0, stderr
    assert f"budget {NODE / devices / 1e9:.2f} GB per device" in stdout
    assert json.loads(out.read_text())["prediction"]["budget_bytes"] == pytest.approx(
        NODE / devices)


def test_a_node_holds_at_most_devices_per_node_and_less_memory_is_kept(tmp_path):
    from ratrain.cli.plan_search import with_node_memory

    hw = load_profile(_cpu_profile(tmp_path))
    hw.devices_per_node = 2  # 4 devices: 2 nodes of 2, each device half of its node's
    assert with_node_memory(hw, 4).device.memory_bytes == NODE / 2
    assert "shared by the 2 devices on it" in with_node_memory(hw, 4).notes["device.memory_bytes"]
    hw.device.memory_bytes = NODE / 4  # the profile's own, less than the share: kept
    assert with_node_memory(hw, 2) is hw


def test_without_node_memory_or_on_a_gpu_the_devices_memory_is_as_before(
        monkeypatch, capsys, tmp_path):
    gpu = load_profile("h100-80g-ib").to_dict()
    gpu["device"]["node_memory_bytes"] = NODE  # a GPU's memory is its own: not split by it
    (tmp_path / "gpu").mkdir()
    spec = tmp_path / "gpu" / "gpu.yaml"
    spec.write_text(yaml.safe_dump(gpu, sort_keys=False))
    for spec, memory in [(_cpu_profile(tmp_path, None), NODE),
                         (spec, gpu["device"]["memory_bytes"])]:
        code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny",
                                       "--profile", str(spec), "--devices", "2", "--top", "1",
                                       "--json")
        assert code == 0, stderr
        assert json.loads(stdout)["plans"][0]["budget_bytes"] == pytest.approx(memory)


def test_simulate_holds_each_rank_to_its_share_of_the_node(monkeypatch, capsys, tmp_path):
    spec = str(_cpu_profile(tmp_path))
    args = ("simulate", "--model", "tiny", "--profile", spec, "--pp", "2", "--global-batch", "4",
            "--micro-batch-size", "1", "--seq-len", "32")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "--json")
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["device_limit_bytes"] == pytest.approx(NODE / 2)
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args)
    assert code == 0, stderr
    assert "a device's memory: the node's memory (30.00 GB, device.node_memory_bytes) shared " \
           "by the 2 devices on it" in stdout
    assert "fits 15.00 GB" in stdout


def test_the_plan_table_says_the_devices_share_of_the_node(monkeypatch, capsys, tmp_path):
    """As simulate says it: the budget above the table was half the profile's memory, unsaid."""
    spec = str(_cpu_profile(tmp_path))
    for devices, said in [(1, False), (2, True)]:
        code, stdout, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny",
                                       "--profile", spec, "--devices", str(devices), "--top", "1")
        assert code == 0, stderr
        line = ("a device's memory: the node's memory (30.00 GB, device.node_memory_bytes) "
                "shared by the 2 devices on it")
        assert (line in stdout) is said, stdout
        assert "--profile plans for another machine" not in stdout


SMALL_NODE = 60e6
"""tiny's node where 1 device overfills and 2 would fit with the whole node each, not with
half of it."""


def _small_request(tmp_path, node_memory: float | None = SMALL_NODE):
    from ratrain.models.presets import get_preset
    from ratrain.planner.layouts import PlanRequest

    hw = load_profile(_cpu_profile(tmp_path, node_memory, memory_bytes=SMALL_NODE))
    return PlanRequest(model=get_preset("tiny"), profile=hw, devices=1, global_batch=8,
                       seq_len=256)


def test_more_devices_are_hinted_at_by_their_share_of_the_node(tmp_path):
    from ratrain.planner.what_fits import fits_with

    assert not fits_with(_small_request(tmp_path), devices=1)
    assert fits_with(_small_request(tmp_path, None), devices=2)  # each the whole node: fits
    assert not fits_with(_small_request(tmp_path), devices=2)  # each half of it: does not


def test_the_accounts_devices_hint_holds_what_the_search_of_them_finds(
        monkeypatch, capsys, tmp_path):
    """It said "2 devices would fit" on one node, and --devices 2 then found nothing."""
    spec = str(_cpu_profile(tmp_path, SMALL_NODE, memory_bytes=SMALL_NODE))
    args = ("plan", "--model", "tiny", "--profile", spec, "--top", "1", "--devices")
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "1")
    assert code != 0 and "no plan fits" in stderr, stdout
    assert "devices would fit" not in stderr
    assert "overfill (each holds 7.50 MB, its share of the node's memory)" in stderr
    code, stdout, stderr = run_cli(monkeypatch, capsys, *args, "2")
    assert code != 0 and "no plan fits 30.00 MB per device" in stderr, stdout
