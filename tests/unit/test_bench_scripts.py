"""bench/scaling.py, bench/correctness.py, bench/fsdp.py, bench/grad_lifetime.py,
bench/sim_breakdown.py and bench/low_bandwidth_report.py: their arithmetic, tables, plots, where
they write them, and command lines on small inputs (no training runs; one real planner search of
a size that takes a fraction of a second)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from .bench_loader import load_bench

scaling = load_bench("scaling")
correctness = load_bench("correctness")
fsdp = load_bench("fsdp")
grad_lifetime = load_bench("grad_lifetime")
sim_breakdown = load_bench("sim_breakdown")


def _row(study, devices, policy, tps):
    return {"study": study, "devices": devices, "policy": policy, "global_batch": devices,
            "search_s": 0.1, "complete": True, "pp": 2, "dp": devices // 2,
            "devices_used": devices, "n_micro": 2, "micro_batch_size": 1, "rank_order": "dp-pp",
            "state_home": "device", "shard_state": True, "view_window": 1,
            "stage_choices": ["recompute", "keep"], "tokens_per_s": tps,
            "tokens_per_s_per_device": tps / devices, "bubble": 0.3, "max_stage_bytes": 17e9}


def _result(rows):
    return {"studies": ["weak"], "rows": rows,
            "settings": {"model": "llama2-7b", "profile": "mt3000", "devices": [8, 16, 32],
                         "sequences_per_device": 1, "strong_batch": 1024, "seq_len": 4096}}


def test_efficiency_is_per_device_against_the_smallest_size_that_fits():
    rows = [_row("weak", 16, "ratrain", 1600.0), _row("weak", 32, "ratrain", 2880.0),
            _row("weak", 16, "baseline", 800.0),
            {"study": "weak", "devices": 8, "policy": "ratrain", "global_batch": 8,
             "search_s": 0.1, "complete": True,
             "account": "no plan fits ...\n  closest: pp=8 dp=1, 1.0 GB over"}]
    scaling.efficiencies(rows)
    assert rows[0]["scaling_efficiency"] == 1.0 and rows[0]["reference_devices"] == 16
    assert abs(rows[1]["scaling_efficiency"] - 0.9) < 1e-12
    assert rows[2]["scaling_efficiency"] == 1.0
    assert "scaling_efficiency" not in rows[3]
    text = scaling.report(_result(rows))
    assert "nothing fits: closest: pp=8 dp=1, 1.0 GB over" in text
    assert "90.0% (vs 16)" in text
    assert "ratrain over baseline (weak): 16: 2.00x" in text
    assert "the paper (measured on MT-3000)" in text


def test_the_scaling_plot_is_written(tmp_path):
    rows = [_row("weak", 16, "ratrain", 1600.0), _row("weak", 32, "ratrain", 2880.0)]
    scaling.efficiencies(rows)
    scaling.plot(_result(rows), tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_a_weak_scaling_point_searches_as_ratrain_plan_does():
    args = argparse.Namespace(model="llama2-7b", profile="mt3000", sequences_per_device=1,
                              strong_batch=1024, seq_len=4096, dtype="float16", budget=20e9,
                              time_limit=30.0)
    row = scaling.plan_at("weak", 8, "ratrain", args)
    assert row["global_batch"] == 8 and row["tokens_per_step"] == 8 * 4096
    if "tokens_per_s" in row:
        assert row["pp"] * row["dp"] <= 8 and row["max_stage_bytes"] <= 20e9 * 0.9
    else:
        assert row["account"].startswith("no plan fits")


def test_correctness_runs_share_everything_but_the_policy_and_layout():
    args = argparse.Namespace(model="tiny", seed=0, seq_len=32, global_batch=4,
                              micro_batch_size=1, steps=5, activation="recompute,keep",
                              baseline_activation="recompute")
    runs = correctness.runs(args)
    common = runs["single"][:runs["single"].index("--pp")]
    for flags in runs.values():
        assert flags[:len(common)] == common
    assert runs["ratrain"][-4:] == ["--activation", "recompute,keep", "--policy", "ratrain"]
    assert runs["baseline"][-4:] == ["--activation", "recompute", "--policy", "baseline"]


def test_deviation_and_window_means():
    assert correctness.deviation([1.0, 2.0, 3.0], [1.0, 2.5, 3.0]) == [0.0, 0.2, 0.0]
    assert correctness.window_means([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 3.5, 5.0]


def test_the_correctness_report_and_plot(tmp_path):
    loss = [3.0, 2.5, 2.0]
    runs = {name: {"layout": name, "loss": list(loss), "wall_s": 1.0, "median_step_s": 0.1}
            for name in ("ratrain", "baseline", "single")}
    runs["single"]["loss"][2] = 2.0 * (1 + 2e-5)
    dev = {}
    for other in ("baseline", "single"):
        per = correctness.deviation(loss, runs[other]["loss"])
        dev[other] = {"max": max(per), "at_step": per.index(max(per)) + 1,
                      "identical_steps": per.count(0.0), "within_target": max(per) <= 1e-5,
                      "max_of_window_means": max(per), "window": 100, "per_step": per}
    result = {"settings": {"model": "tiny", "seq_len": 32, "global_batch": 4,
                           "micro_batch_size": 1, "steps": 3},
              "tokens_trained": 384, "runs": runs, "deviation": dev, "budget_s": 900.0,
              "steps_in_budget": 2000}
    text = correctness.report(result)
    assert "ratrain vs baseline: max relative loss deviation 0.000e+00" in text
    assert "ABOVE the 1e-5 target" in text
    correctness.plot(result, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000


def test_fsdp_ratrain_rows_are_the_sharded_cli_run_plus_their_own_flags():
    args = argparse.Namespace(row=["transient=--grad-lifetime transient"], view_window=1)
    rows = fsdp.rows(args)
    assert rows == {"fsdp2": None, "ratrain-sharded": [],
                    "transient": ["--grad-lifetime", "transient"]}
    cmd = fsdp.ratrain_command(args, 4, rows["transient"], Path("c.yaml"), Path("run"))
    assert cmd[cmd.index("--dp") + 1] == "4" and cmd[cmd.index("--pp") + 1] == "1"
    assert "--shard-state" in cmd and cmd[cmd.index("--view-window") + 1] == "1"
    assert cmd[-2:] == ["--grad-lifetime", "transient"]
    for bad in ("no-equals-sign", "ratrain-sharded=--dtype float32"):  # a name taken
        with pytest.raises(SystemExit):
            fsdp.rows(argparse.Namespace(row=[bad], view_window=1))
    with pytest.raises(SystemExit, match="--steps must be >= 2"):
        fsdp.main(["--steps", "1"])


def test_fsdp_summary_medians_largest_rank_and_loss_difference_against_ratrain():
    def run(times, losses, rss_mib):
        return {"step_times_s": times, "losses": losses,
                "peak_rss_bytes_per_rank": [m * fsdp.MIB for m in rss_mib],
                "rss_growth_bytes_per_rank": [m * fsdp.MIB // 2 for m in rss_mib]}

    ratrain = [run([9.0, 1.0], [2.0, 1.0], [100, 90]), run([9.0, 2.0], [2.0, 1.0], [100, 90]),
               run([9.0, 1.0], [2.0, 1.0], [100, 90])]
    peer = [run([0.1, 2.0], [2.0, 1.01], [130, 140]), run([0.1, 2.0], [2.0, 1.01], [150, 120]),
            run([0.1, 4.0], [2.0, 1.01], [110, 100])]
    s = fsdp.summarize(peer, ratrain, tokens_per_step=100)
    assert s["tokens_per_s"] == {"median": 50.0, "min": 25.0, "max": 50.0}  # first step untimed
    assert s["vs_ratrain"] == 0.5  # rounds' ratios 0.5, 1.0, 0.25
    assert s["peak_rss_mib"] == 140 and s["rss_growth_mib"] == 70
    assert abs(s["max_rel_loss_diff_vs_ratrain"] - 0.01) < 1e-12 and s["losses_repeat"]
    result = {"layouts": {"2": {"rows": {"fsdp2": s}, "failed": {"x": "exit 2: no such option"}}}}
    text = fsdp.table(result)
    assert "| 2 | fsdp2 | 50 (25-50) | 0.500 | 140 | 70 | 1.00e-02 |" in text
    assert "| 2 | x | failed: exit 2: no such option |" in text


def test_grad_lifetime_report_falls_from_step_and_the_budget_check():
    mib, mb = grad_lifetime.MIB, 1e6

    def run(ledger_mib, rss_mib, step_s=1.0, peak_mb=(100, 100)):
        return {"ledger_peak": [ledger_mib * mib] * 2, "peak_rss": [m * mib for m in rss_mib],
                "tokens_per_s": 100.0, "step_time_s": step_s, "peak": [p * mb for p in peak_mb]}

    memory = {"glibc default": {"step": [run(300, (800, 820)), run(300, (810, 830))],
                                "transient": [run(200, (700, 760)), run(200, (720, 740))]}}
    planned = {"budget": "300MB", "devices": 2, "global_batch": 4,
               "accounts": {"step only": "error: no plan fits 300.00 MB\n  closest: ..."},
               "plans": {"every lifetime": {
                   "plan": {"pp": 1, "dp": 2, "micro_batch_size": 1, "shard_state": True,
                            "grad_lifetime": "transient", "view_window": 1,
                            "stage_choices": ["keep"]},
                   "predicted": {"step_time_s": 2.0, "stage_peak_bytes": [250e6]},
                   "runs": {"glibc default": [run(0, (0, 0), 2.2, (290, 301)),
                                              run(0, (0, 0), 2.1, (280, 295))]}}}}
    text = grad_lifetime.report({"model": "small", "seq_len": 256, "memory": memory,
                                 "planned": planned})
    # medians per rank (805, 825) and (710, 750): the largest rank falls 75, the ledger 100
    assert "| glibc default | transient | 200 | 710, 750 | 100 / 75 | 100 |" in text
    assert "| glibc default | step | 300 | 805, 825 | 0 / 0 | 100 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| every lifetime"))
    assert "sharded, grad transient, views window 1, keep" in row
    assert "| 2.200, 2.100 | +7.5% | 290.0, 301.0 | NO |" in row  # rank 1 went over 300 MB
    assert "step only: error: no plan fits 300.00 MB" in text


def test_sim_breakdown_sums_a_trace_per_op_and_step_and_groups_the_ops():
    from ratrain.runtime.trace import chrome_trace

    events = {0: [(3, "F1.0", 0, 100_000), (3, "WRG1.0", 100_000, 150_000),
                  (3, "SA1.0", 150_000, 151_000),
                  (4, "F1.0", 200_000, 260_000), (4, "B1.0", 260_000, 400_000)],
              1: [(3, "F2.0", 0, 50_000), (4, "F2.0", 200_000, 300_000)]}
    sends = {0: [(3, "SA1.0", 150_000, 190_000)]}  # the async track: not an action
    trace = chrome_trace(events, {}, sends)
    got = sim_breakdown.measured_per_op(trace)
    assert got[0] == pytest.approx({"F": 0.08, "WRG": 0.025, "SA": 0.0005, "B": 0.07})
    assert got[1] == pytest.approx({"F": 0.075})
    assert sim_breakdown.grouped(got[0]) == pytest.approx(
        {"compute": 0.15, "waits": 0.025, "rest": 0.0005})
    assert sim_breakdown.traced_step_s(trace) == pytest.approx((0.151 + 0.2) / 2)


def test_sim_breakdown_simulated_ops_cover_each_stage_and_its_compute():
    from ratrain.sim.profile import load_profile
    from ratrain.sim.simulator import simulate

    c = next(c for c in sim_breakdown.sa.SETS["all"] if c.label == "2x1 recompute")
    cfg = sim_breakdown.sa._config(c, 1)
    sim = simulate(sim_breakdown.sa._plan(cfg, c), cfg.model, load_profile("cpu-local"),
                   micro_batch_size=c.micro, seq_len=c.seq)
    per_stage = sim_breakdown.simulated_per_op(sim)
    assert sorted(per_stage) == [0, 1] and "R" in per_stage[0]
    for r in sim.ranks:
        ops = per_stage[r.stage]
        assert sum(ops.values()) == pytest.approx(r.end, rel=1e-9)
        assert sim_breakdown.grouped(ops)["compute"] == pytest.approx(r.compute, rel=0.01)
    row = {"config": c.label, "round": 1,
           "step_time_s": {"measured": 1.0, "traced": 0.9, "predicted": sim.step_time},
           "ranks": [{"rank": 0, "stage": 0, "measured": per_stage[0], "predicted": per_stage[0]}]}
    text = sim_breakdown.report({"rows": [row]})
    assert "2x1 recompute (round 1): step 1.000 s measured (the traced steps: 0.900 s)" in text
    assert "(1.00)" in text


def test_the_schedules_bench_adds_a_unit_major_row_per_group_with_its_ratios():
    cli = load_bench("schedules_args")
    report = load_bench("schedules_report")
    impl = load_bench("schedules_implementations")
    args = cli.parser("").parse_args(["--configs", "1x2", "--auto", "--groups", "2,4"])
    layout = impl.Layout(pp=1, dp=2, order="pp-dp")
    impls, _ = impl.implementations(args, layout)
    rows = {d["name"]: d for d in impls}
    assert rows["1f1b-g2"]["group"] == 2 and rows["1f1b-g4"]["group"] == 4
    assert impl.make_config(args, layout, rows["1f1b-g4"]).parallel.micro_batch_group == 4
    assert impl.make_config(args, layout, rows["ratrain"]).parallel.micro_batch_group is None
    pairs = report.ratio_pairs(impls)
    assert ("1f1b-g2", "baseline") in pairs and ("1f1b-g4", "ratrain") in pairs
    for bad in ("1", "2,2", "x"):
        with pytest.raises(SystemExit):
            cli.parser("").parse_args(["--groups", bad])


def test_the_host_gradient_update_bench_times_both_paths_and_puts_the_gpu_flag_back(
        tmp_path, monkeypatch):
    import json
    import sys

    from ratrain.runtime.unit_state import UnitState

    bench = load_bench("host_grad_update")
    real = UnitState._host_homed_on_gpu
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["host_grad_update.py", "--dim", "32", "--ffn", "64",
                                      "--rounds", "3", "--out", str(out)])
    bench.main()
    result = json.loads(out.read_text())
    assert UnitState._host_homed_on_gpu is real
    for path in ("host_for_gpu", "cpu_only"):
        assert result[path]["params"] == 4 * 32 * 32 + 3 * 32 * 64 + 2 * 32
        times = result[path]["median_s"]
        assert times["float32"] > 0 and result[path]["bf16_over_fp32"] == pytest.approx(
            times["bfloat16"] / times["float32"])


def test_a_figure_goes_beside_an_out_given_and_a_scaling_replot_says_what_it_wrote(
        tmp_path, monkeypatch, capsys):
    import json

    outputs = load_bench("outputs").outputs
    default = (Path("bench/results/r.json"), Path("docs/r.png"))
    assert outputs(None, None, *default) == default
    assert outputs("/tmp/x.json", None, *default) == (Path("/tmp/x.json"), Path("/tmp/x.png"))
    assert outputs("/tmp/x.json", "", *default) == (Path("/tmp/x.json"), None)
    assert outputs(None, "/tmp/p.png", *default) == (default[0], Path("/tmp/p.png"))
    rows = [_row("weak", 16, "ratrain", 1600.0), _row("weak", 32, "ratrain", 2880.0)]
    scaling.efficiencies(rows)
    (tmp_path / "s.json").write_text(json.dumps(_result(rows)))
    monkeypatch.setattr("sys.argv", ["scaling.py", "--replot", "--out", str(tmp_path / "s.json")])
    scaling.main()
    assert (tmp_path / "s.png").stat().st_size > 10_000
    assert f"wrote {tmp_path / 's.png'}" in capsys.readouterr().out


def _link_run(sync, tps, invocation=None, steps=150):
    run = {"rate": "50mbit", "pp": 1, "sync": sync, "steps": steps, "tokens_per_s": tps,
           "tokens_per_step": 1024, "loss": [3.0] * steps, "val_loss": {str(steps): 2.0},
           "bytes_at_step": [9] * steps, "wall_at_step": [float(i) for i in range(steps)],
           "wall_s": 1.0}
    return {**run, "invocation_utc": invocation} if invocation else run


def test_low_bandwidth_ratios_pair_runs_of_one_invocation_and_the_figure_follows_out(
        tmp_path, capsys):
    import json

    lb, report = load_bench("low_bandwidth"), load_bench("low_bandwidth_report")
    results = [_link_run("step", 100.0, "T1"), _link_run("diloco:50", 300.0, "T1"),
               _link_run("step", 50.0, "T2"), _link_run("diloco:10", 400.0, "T3")]
    got = {r["run"]["invocation_utc"]: r["speedup"] for r in report.rows(results)
           if r["run"]["sync"] != "step"}
    assert got == {"T1": 3.0, "T3": None}  # not T2's slower sync run; T3 had none
    text = report.table(report.rows(results))
    assert "| x sync (this invocation's) |" in text and "| diloco:10  | 150 | 400 | - |" in text
    legacy = report.table(report.rows([_link_run("step", 100.0), _link_run("diloco:50", 300.0)]))
    assert "x sync (invocation not recorded" in legacy and "| **3.00** |" in legacy
    (tmp_path / "lb.json").write_text(json.dumps(results))
    assert lb.main(["--report", "--out", str(tmp_path / "lb.json")]) == 0
    assert (tmp_path / "lb.png").stat().st_size > 10_000
    assert f"wrote {tmp_path / 'lb.png'}" in capsys.readouterr().out
