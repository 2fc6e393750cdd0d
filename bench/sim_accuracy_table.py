"""The table of a bench/sim_accuracy.py result (plain data, as its JSON holds it): per
configuration predicted against measured step time, ledger and RSS growth, then the errors'
medians and largest, in sample and out, the signed error's median against its spread (a median
farther from 0 than the spread is a bias, not noise), and how far the rounds of one
configuration are apart."""

from __future__ import annotations

import statistics

from ratrain.sim.profile_repeats import spread


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def signed_spread(errors: list[float]) -> tuple[float, float]:
    """(median, spread) of signed errors: the spread is their standard deviation (0 for one)."""
    return (statistics.median(errors),
            statistics.stdev(errors) if len(errors) > 1 else 0.0)


def signed_line(which: str, errors: list[float]) -> str:
    """The signed error's median, its spread and whether the median lies within it."""
    mid, sd = signed_spread(errors)
    return (f"step time {which}, signed error: median {mid:+.1%}, spread (standard deviation) "
            f"{sd:.1%}, from {min(errors):+.1%} to {max(errors):+.1%}; the median "
            f"{'lies' if abs(mid) <= sd else 'does not lie'} within its spread "
            f"(|median| {'<=' if abs(mid) <= sd else '>'} spread)")


def table(result: dict) -> str:
    head = ["config", "n_micro", "step predicted (s) (range over unstable figures)",
            "measured (s) (per round)", "error",
            "stage: ledger predicted / measured MiB (error)", "RSS growth predicted / measured MiB (error)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    errors: dict[str, list[float]] = {"in sample": [], "out of sample": []}
    signed: dict[str, list[float]] = {"in sample": [], "out of sample": []}
    before: dict[str, list[float]] = {"in sample": [], "out of sample": []}
    paired: dict[str, list[float]] = {"in sample": [], "out of sample": []}
    rounds_apart, in_range, ranged = [], 0, 0
    for row in result["rows"]:
        st = row["step_time_s"]
        e = _err(st["predicted"], st["measured"])
        which = "in sample" if row.get("in_sample", True) else "out of sample"
        errors[which].append(abs(e))
        signed[which].append(e)
        if "predicted_from_first_repeat" in st:
            before[which].append(abs(_err(st["predicted_from_first_repeat"], st["measured"])))
        if len(st["measured_per_round"]) > 1:
            rounds_apart.append(spread(st["measured_per_round"]))
        if "predicted_per_round" in st:
            per_round = [_err(p, m) for p, m in zip(st["predicted_per_round"],
                                                    st["measured_per_round"])]
            paired[which].append(abs(statistics.median(per_round)))
        if "predicted_range" in st:
            ranged += 1
            in_range += st["predicted_range"][0] <= st["measured"] <= st["predicted_range"][1]
        led, rss = row["ledger_bytes"], row["rss_growth_bytes"]
        mib = 2 ** 20
        ledger_cells = "; ".join(
            f"{s}: {p / mib:.1f} / {m / mib:.1f} ({_err(p, m):+.1%})"
            for s, (p, m) in enumerate(zip(led["predicted"], led["measured"])))
        rss_cells = "-" if rss["measured"] is None else "; ".join(
            f"{s}: {p / mib:.1f} / {m / mib:.1f} ({_err(p, m):+.1%})"
            for s, (p, m) in enumerate(zip(rss["predicted"], rss["measured"])))
        edges = (" ({:.3f}-{:.3f})".format(*st["predicted_range"])
                 if "predicted_range" in st else "")
        rounds = ", ".join(f"{t:.3f}" for t in st["measured_per_round"])
        lines.append(f"| {row['config']} | {row['n_micro']} | {st['predicted']:.3f}{edges} | "
                     f"{st['measured']:.3f} ({rounds}) | {e:+.1%} | {ledger_cells} | {rss_cells} |")
    for which, errs in errors.items():
        if errs:
            lines.append(f"\nstep time {which}: median |error| {statistics.median(errs):.1%}, "
                         f"largest {max(errs):.1%}")
            lines.append(signed_line(which, signed[which]))
        if paired[which]:
            lines.append(f"step time {which}, each run from the profile repeat just before it: "
                         f"median |error| {statistics.median(paired[which]):.1%}, largest "
                         f"{max(paired[which]):.1%}")
        if before[which] and result.get("profile_repeats"):
            lines.append(f"step time {which}, from the first profile repeat alone: median "
                         f"|error| {statistics.median(before[which]):.1%}, largest "
                         f"{max(before[which]):.1%}")
    if ranged:
        lines.append(f"measured within the range the profile's unstable figures give "
                     f"(fastest to slowest repeat): {in_range} of {ranged}")
    if rounds_apart:
        lines.append(f"rounds of one configuration apart ((max - min) / median): median "
                     f"{statistics.median(rounds_apart):.1%}, largest {max(rounds_apart):.1%}")
    return "\n".join(lines)
