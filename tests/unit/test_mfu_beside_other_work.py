"""An MFU above 100% on a profile measured beside other work names that work as why the peak
is low, not the peak the user gave; a quiet profile's, or one whose busy repeats were set
aside, still says the given peak is low."""

from ratrain.sim.profile import load_profile
from ratrain.sim.profile_repeats import combine
from ratrain.training import mfu

SIZES = [4096.0]


def _mfu_line(profile) -> str:
    peak = mfu.run_peak("cpu", "float32", 1, 1, profile=profile)
    return mfu.mfu_in_words({"mfu": 1.3, "peak_flops": peak.flops,
                             "peak_flops_source": peak.source})


def test_a_profile_measured_beside_other_work_is_blamed_not_the_given_peak():
    repeat = load_profile("cpu-local")
    loaded = combine([repeat, repeat], SIZES, other_work=[1.4, 0.9])
    assert "profile cpu-local (measured beside other work): float32 " in \
        mfu.run_peak("cpu", "float32", 1, 1, profile=loaded).source
    line = _mfu_line(loaded)
    assert line.startswith("n/a (the profile's peak is low, measured while other work kept "
                           "the machine busy: the run's model FLOP/s are 130% of "), line
    assert "given" not in line
    # one measurement alone, beside other work: the same
    assert _mfu_line(combine([repeat], SIZES, other_work=[1.4])).startswith(
        "n/a (the profile's peak is low, measured while other work")


def test_a_quiet_profile_or_one_whose_busy_repeats_were_set_aside_says_the_given_peak():
    repeat = load_profile("cpu-local")
    quiet = combine([repeat, repeat], SIZES, other_work=[0.0, 0.1])
    set_aside = combine([repeat, repeat, repeat], SIZES, other_work=[1.4, 0.1, 0.0])
    assert "set aside" in set_aside.notes["other_work"]
    for profile in (quiet, set_aside, repeat):
        assert _mfu_line(profile).startswith("n/a (peak given low: "), profile.notes
