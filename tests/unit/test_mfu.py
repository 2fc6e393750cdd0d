"""MFU: the FLOPs per token against a hand computation, the device peaks, the arithmetic."""

from __future__ import annotations

import pytest

from ratrain.training import mfu
from ratrain.config import ModelConfig
from ratrain.sim.profile import load_profile


def _small(**kw) -> ModelConfig:
    return ModelConfig(name="hand", vocab_size=100, dim=16, n_layers=2, n_heads=4, ffn_dim=40, **kw)


def test_flops_per_token_by_hand():
    # per block: q, k, v, o 4 x 16 x 16 = 1024; SwiGLU 3 x 16 x 40 = 1920; two norms 32
    block = 1024 + 1920 + 32
    head = 100 * 16 + 16  # lm_head + final norm; the embedding table (a lookup) is left out
    n = 2 * block + head
    assert n == 7568
    assert mfu.matmul_params(_small()) == n
    # attention: 12 x layers 2 x heads 4 x head_dim 4 x seq_len 8
    assert mfu.flops_per_token(_small(), seq_len=8) == 6 * 7568 + 12 * 2 * 4 * 4 * 8 == 48480


def test_flops_per_token_tied_and_grouped_query():
    # tied: the head's matrix is the embedding's, still one product per token
    assert mfu.matmul_params(_small(tie_embeddings=True)) == 7568
    # 2 kv heads: k and v are 16 x 8 each; attention counts the 4 query heads
    gqa = _small(n_kv_heads=2)
    block = 16 * 16 * 2 + 16 * 8 * 2 + 1920 + 32
    assert mfu.flops_per_token(gqa, 8) == 6 * (2 * block + 1616) + 12 * 2 * 4 * 4 * 8


def test_tiny_preset_flops_per_token():
    from ratrain.models.presets import get_preset

    tiny = get_preset("tiny")  # dim 256, 4 layers, 8 heads, ffn 688, vocab 512
    n = 4 * (4 * 256 * 256 + 3 * 256 * 688 + 2 * 256) + 512 * 256 + 256
    assert mfu.flops_per_token(tiny, 256) == 6 * n + 12 * 4 * 8 * 32 * 256


@pytest.mark.parametrize("name,key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100-PCIE-40GB", "A100"),
    ("Tesla T4", None)])
def test_gpu_datasheet_by_name(name, key):
    assert mfu.gpu_datasheet_key(name) == key


def test_gpu_peak_is_the_datasheet_times_the_gpus():
    peak = mfu.run_peak("cuda", "bfloat16", 8, 1, device_name="NVIDIA H100 80GB HBM3")
    assert peak.flops == 8 * 989e12 and "datasheet" in peak.source
    assert mfu.run_peak("cuda", "float32", 1, 1, device_name="NVIDIA H200").flops == 67e12
    assert mfu.run_peak("cuda", "float32", 1, 1, device_name="NVIDIA A100-SXM4-40GB").flops == 19.5e12
    unknown = mfu.run_peak("cuda", "bfloat16", 2, 1, device_name="Tesla T4")
    assert unknown.flops is None and "Tesla T4" in unknown.source
    assert mfu.mfu(1e6, 1e3, unknown.flops) is None
    # an unknown GPU takes a given profile's peak
    h100 = load_profile("h100-80g-ib")
    peak = mfu.run_peak("cuda", "bfloat16", 2, 1, h100, "Tesla T4")
    assert peak.flops == 2 * h100.device.compute["bfloat16"].peak_flops


def test_cpu_peak_from_a_profile_per_core(monkeypatch):
    monkeypatch.setattr(mfu, "usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpu = load_profile("cpu-local")
    # 4 ranks of 1 thread on 2 cores compute on 2 cores; one process of 1 thread on 1
    assert mfu.run_peak("cpu", "float32", 4, 1, cpu).flops == 2 * 8e10
    assert mfu.run_peak("cpu", "float32", 1, 1, cpu).flops == 8e10
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun: 2 nodes of 2 ranks
    assert mfu.cpu_cores_used(4, 1) == 4


def test_cpu_peak_measured_without_a_profile():
    peak = mfu.run_peak("cpu", "float32", 1, 1)
    assert 1e8 < peak.flops < 1e13 and peak.source.startswith("measured")


def test_mfu_arithmetic():
    assert mfu.mfu(48480, 1000.0, 48480 * 4000.0) == pytest.approx(0.25)


def test_the_peaks_devices_are_counted_in_words(monkeypatch):
    monkeypatch.setattr(mfu, "usable_cores", lambda: 2)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpu = load_profile("cpu-local")
    assert mfu.run_peak("cpu", "float32", 1, 1, cpu).source.endswith(" per core x 1 core")
    assert mfu.run_peak("cpu", "float32", 2, 1, cpu).source.endswith(" per core x 2 cores")
    assert mfu.run_peak("cuda", "bfloat16", 1, 1, device_name="NVIDIA H200").source.endswith(" x 1 GPU")
    assert mfu.run_peak("cuda", "bfloat16", 8, 1, device_name="NVIDIA H200").source.endswith(" x 8 GPUs")


def test_a_measured_cpu_peak_is_reused_on_its_own_machine_only(monkeypatch):
    monkeypatch.setattr(mfu, "measure_cpu_core_peak", lambda dtype="float32": 5e9)
    first = mfu.run_peak("cpu", "float32", 1, 1)
    assert first.measured == {"machine": mfu.cpu_machine("float32"), "flops_per_core": 5e9}
    monkeypatch.setattr(mfu, "measure_cpu_core_peak", lambda dtype="float32": 7e9)
    again = mfu.run_peak("cpu", "float32", 1, 1, measured_before=first.measured)
    assert again.flops == first.flops and again.measured == first.measured
    for other in ({"host": "elsewhere"}, {"cores": 1000}):
        record = {**first.measured, "machine": {**first.measured["machine"], **other}}
        assert mfu.run_peak("cpu", "float32", 1, 1, measured_before=record).flops == 7e9
    assert mfu.run_peak("cpu", "bfloat16", 1, 1, measured_before=first.measured).flops == 7e9


class _Machine:
    """A fake wall clock and CPU-time clock, and work that moves them by scripted amounts: a
    repeat's (wall, cpu) seconds, the warm-up's first."""

    def __init__(self, repeats: list[tuple[float, float]]):
        self.wall = self.cpu = 0.0
        self.repeats = list(repeats)
        self.runs = 0

    def work(self):
        wall, cpu = self.repeats[min(self.runs, len(self.repeats) - 1)]
        self.wall += wall
        self.cpu += cpu
        self.runs += 1

    def fastest(self, repeats=6, budget_s=1.0) -> float:
        return mfu.fastest_seconds(self.work, (lambda: self.wall, lambda: self.cpu),
                                   repeats, budget_s)


def test_the_peak_is_the_fastest_repeat_one_slow_one_does_not_count():
    machine = _Machine([(0.1, 0.1)] * 3 + [(0.5, 0.5)] + [(0.1, 0.1)] * 3)
    assert machine.fastest(budget_s=0) == pytest.approx(0.1)
    assert machine.runs == 7  # the warm-up and 6 repeats: the budget is spent


def test_a_descheduled_repeat_counts_its_cpu_time_not_its_wall_time():
    # every repeat waited 0.3 s for another process: the wall clock alone says 0.4 s
    machine = _Machine([(0.4, 0.1)] * 7)
    assert machine.fastest(budget_s=0) == pytest.approx(0.1)
    # CPU time above the wall's (another thread of the process busy too) is not the repeat's
    assert _Machine([(0.1, 0.3)] * 7).fastest(budget_s=0) == pytest.approx(0.1)


def test_the_repeats_go_on_while_the_budget_lasts():
    # six repeats in a busy spell, the seventh after it: the spell is not the peak
    machine = _Machine([(0.25, 0.25)] * 7 + [(0.125, 0.125)] * 20)
    assert machine.fastest(repeats=6, budget_s=2.0) == 0.125
    assert machine.runs == 9  # warm-up and 6 repeats: 1.75 s; 2 more start within the 2 s


MEASURED = "measured: 1024x1024 float32 matmul on 1 thread, 43.7 GFLOP/s per core x 1 core"


def test_an_mfu_above_100_percent_is_said_to_be_of_a_low_peak():
    summary = {"mfu": 1.16, "peak_flops": 43.7e9, "peak_flops_source": MEASURED}
    assert mfu.mfu_in_words(summary) == ("n/a (peak measured low: the run's model FLOP/s are "
                                         "116% of the 43.7 GFLOP/s peak)")
    given = mfu.mfu_in_words({**summary, "peak_flops_source": "profile cpu-local: ..."})
    assert given.startswith("n/a (peak given low: ")
    assert mfu.mfu_in_words({**summary, "mfu": 0.383}) == "38.3%"
    assert mfu.mfu_in_words({**summary, "mfu": 1.0}) == "100.0%"
    assert mfu.mfu_in_words({"mfu": None}) == "n/a"


def test_the_report_shows_no_mfu_above_100_percent():
    from types import SimpleNamespace

    from ratrain.report import run_figures

    summary = {"mfu": 1.16, "peak_flops": 43.7e9, "flops_per_token": 22.9e6,
               "peak_flops_source": MEASURED}
    shown = run_figures.mfu(SimpleNamespace(summary=summary))
    assert shown.mfu is None and shown.peak_flops is None
    assert shown.source == ("peak measured low: the run's model FLOP/s are 116% of the "
                            f"43.7 GFLOP/s peak; {MEASURED}")
    fine = run_figures.mfu(SimpleNamespace(summary={**summary, "mfu": 0.38}))
    assert (fine.mfu, fine.peak_flops, fine.source) == (0.38, 43.7e9, MEASURED)


def test_the_reports_tokens_per_s_says_it_is_tokens_over_time_not_a_mean_of_rates():
    from types import SimpleNamespace

    from ratrain.report import run_figures

    run = SimpleNamespace(summary={"tokens_per_s": 731.0, "tokens_per_s_of_steps": "2-20"})
    assert run_figures.tokens_per_s(run) == (731.0, "tokens of steps 2-20 over their time")
