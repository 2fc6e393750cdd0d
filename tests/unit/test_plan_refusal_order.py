"""`ratrain plan`'s refusals of pinned flags: the one that no other flag can lift (the model's
units) told first, and --micro-batch-size 0 refused, not taken as "not given"."""

from __future__ import annotations

from .cli_runner import run_cli

PLAN = ("plan", "--model", "tiny", "--profile", "cpu-local", "--threads", "1")


def test_pp_beyond_the_models_units_is_told_before_devices_or_batch(monkeypatch, capsys):
    # 2 devices and a global batch of 8 are too few for 10 stages too: raising them would not help
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--memory-budget", "50MB", "--pp", "10")
    assert code == 2
    assert err.strip() == ("error: --pp 10 is more stages than the model has units (6: "
                           "embedding, 4 decoder blocks, head); lower --pp to at most 6")


def test_micro_batch_size_zero_is_refused_as_in_simulate(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--micro-batch-size", "0")
    assert code == 2
    assert err.strip() == ("error: --micro-batch-size (train.micro_batch_size) must be "
                           "positive, got 0")


def test_a_pinned_flag_that_alone_keeps_every_plan_out_is_named(monkeypatch, capsys):
    # 2x1 fits 50 MB; --grad-lifetime transient needs sharded state, which does not
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--memory-budget", "50MB",
                           "--grad-lifetime", "transient")
    assert code == 2
    assert ("  without --grad-lifetime transient a plan fits: leave it out for the search to "
            "choose") in err.splitlines()
    # its closest plan frees nothing before its peak: no "instead of" the same bytes
    lifetime = next(line for line in err.splitlines() if "already freed early" in line)
    assert "instead of" not in lifetime and lifetime.endswith("its peak comes before any is freed")


def test_no_pinned_flag_hint_where_none_was_pinned(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--memory-budget", "20MB")
    assert code == 2 and "a plan fits: leave it out" not in err


def test_a_partition_that_misses_the_models_units_names_the_flag(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "simulate", "--model", "tiny", "--pp", "2",
                           "--partition", "1,1", "--threads", "1")
    assert code == 2
    assert err.strip() == ("error: --partition 1,1 places 2 units; the model has 6 (embedding, "
                           "4 decoder blocks, head): the counts must sum to 6")


def test_a_device_is_counted_and_its_article_read_as_the_name_is():
    from ratrain.planner.wording import a_device

    assert [a_device(n) for n in ("cpu-local", "mt3000", "h100", "measured-vm", "a100")] == [
        "a cpu-local device", "an mt3000 device", "an h100 device", "a measured-vm device",
        "an a100 device"]


def test_the_no_fit_account_counts_one_device(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--devices", "1", "--memory-budget", "5MB")
    assert code == 2 and " for tiny on 1 cpu-local device, global batch " in err


def test_a_share_far_past_the_budget_is_said_as_a_multiple(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--memory-budget", "1KB")
    block = next(line for line in err.splitlines() if "one decoder block's" in line)
    assert code == 2 and "x the budget" in block and "%" not in block


def test_a_dtype_the_profile_has_no_rate_for_says_the_way_out():
    import dataclasses

    import pytest

    from ratrain.errors import UserError
    from ratrain.sim.profile import load_profile

    hw = load_profile("cpu-local")
    measured = dataclasses.replace(hw, name="measured-vm", device=dataclasses.replace(
        hw.device, compute={"float32": hw.device.compute["float32"]}))
    with pytest.raises(UserError) as info:
        measured.rate("float16")
    assert str(info.value) == ("profile measured-vm has no compute rate for float16; it knows "
                               "float32: measure float16 on the machine with `ratrain profile "
                               "--dtype float16`, or run in --dtype float32")


def test_a_budget_above_this_machines_memory_does_not_advise_profiling_it(monkeypatch, capsys):
    import ratrain.host_memory

    monkeypatch.setattr(ratrain.host_memory, "available_host_bytes", lambda: 8e9)
    code, _, err = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--threads", "1",
                           "--memory-budget", "20GB")
    assert code == 0
    assert ("note: the plans are held to the device's memory: a cpu-local device has 4.00 GB, "
            "less than the 20.00 GB asked (this machine's available memory, shared by the "
            "devices searched)") in err.splitlines()
    # with --profile, the preset's memory: a profile of this machine is the way to its own
    code, _, err = run_cli(monkeypatch, capsys, *PLAN, "--memory-budget", "20GB")
    assert code == 0 and "with its own memory: `ratrain profile`" in err


def test_an_h_that_does_not_hide_the_outer_sync_says_what_it_falls_short_of():
    """It said "the fastest H weighed, still short: 1,737,739 tokens/s predicted against
    116,270 (14.95x)": short of nothing the line names, and faster."""
    from ratrain.sim import low_comm

    option = low_comm.Option(sync="diloco:100:4", every=100, fragments=4, mean_step_s=1.1,
                             hidden=False, bytes_per_period=24_000_000, results=[])
    text = low_comm.advice(low_comm.LowComm(step_s=16.0, inner_s=1.0, options=[option]), 1024)
    assert "still short" not in text
    assert ("--sync diloco:100:4 is the fastest H weighed, though it does not hide the outer "
            "sync (its mean step 1.1 s is 10% above the 1 s step without a sync; hidden is "
            "within 5%)") in text
