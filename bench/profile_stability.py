"""Does `ratrain profile` repeat? Two profiles of this machine, figure by figure.

Runs `ratrain profile` twice (or reads two profile files), and for every figure the simulator
uses prints both values, their spread ((max - min) / median; a link by the times it predicts
for the measured sizes, contention by the slowdown it applies: sim/profile_repeats.py) and
whether either profile marked the figure as unstable (its `unstable` edges, or its notes for a
figure with no edges, such as a peak or a memory figure). A figure passes when the two agree
within 10%, or when a profile marked it unstable: the simulator uses its median, as every
figure's, and states the range its edges give (docs/planner.md). A figure only one profile has
(a rate it did not measure, a profile with no `measured` shapes) is listed apart, not compared.

    python bench/profile_stability.py [--profiles A.yaml B.yaml] [--repeats 3]
                                      [--out bench/results/profile_stability.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratrain.errors import UserError
from ratrain.profiling.ranks import LINK_SIZES
from ratrain.sim.profile import load_profile
from ratrain.sim.profile_repeats import TOLERANCE, figures, spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

# Descriptive figures the simulator does not use to time or size anything (the shape fields
# of every measured entry, its model's included, not of the first alone), and a cluster's
# groups, which `ratrain profile` does not write.
NOT_USED = re.compile(r"device\.memory_bytes|device\.cores|devices_per_node|groups.*"
                      r"|measured\[\d+\]\.(seq_len|micro_batch_size|model_shape\..*)")


def _profiles(args, tmp: Path) -> list[Path]:
    if args.profiles:
        return [Path(p) for p in args.profiles]
    paths = []
    for i in (1, 2):
        path = tmp / f"profile{i}.yaml"
        subprocess.run([sys.executable, "-m", "ratrain.cli", "profile", "--repeats",
                        str(args.repeats), "--out", str(path)], check=True)
        paths.append(path)
    return paths


def compare(paths: list[Path]) -> tuple[list[dict], dict[str, list[int]]]:
    """Rows of the figures both profiles have, and the others: figure -> the profiles (1, 2)
    that lack it. A file that is no profile is a UserError."""
    profiles = [load_profile(str(p)) for p in paths]
    per_profile = [{path: v for path, v in figures(p.to_dict(), LINK_SIZES).items()
                    if not NOT_USED.fullmatch(path)} for p in profiles]
    every = sorted(set().union(*per_profile))
    missing = {path: [i + 1 for i, f in enumerate(per_profile) if path not in f]
               for path in every if not all(path in f for f in per_profile)}
    rows = []
    for path in (p for p in every if p not in missing):
        s = max(spread([f[path][i] for f in per_profile])
                for i in range(len(per_profile[0][path])))
        marked = any(_marked(path, p) for p in profiles)
        rows.append({"figure": path, "values": [f[path][-1] for f in per_profile],
                     "spread": s, "marked_unstable": marked,
                     "passes": s <= TOLERANCE or marked})
    return rows, missing


def _marked(figure: str, profile) -> bool:
    """Whether the profile marked a figure (a path of `figures`) as unstable: an edge of it
    in `unstable` (a link's edges are its bandwidth and latency, an achieved rate's its
    efficiency), or, for a figure that prices no time and so has no edges, its notes."""
    edges = profile.unstable.get("slow", {})
    rate, _, key = figure.rpartition(".")
    own = {"achieved": f"{rate}.efficiency",
           "attention_achieved": f"{rate}.attention_efficiency"}.get(key, figure)
    return (any(path == own or path.startswith(figure + ".") for path in edges)
            or f"{figure} spread" in profile.notes.get("stability", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs=2, metavar="FILE", help="two profiles to compare")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/profile_stability.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            rows, missing = compare(_profiles(args, Path(tmp)))
        except UserError as e:  # a file that is no profile: one line, no traceback
            raise SystemExit(f"{ap.prog}: error: {e}") from None
    Path(args.out).write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                                          "argv": sys.argv[1:], "rows": rows,
                                          "missing": missing}, indent=2))
    print("| figure | profile 1 | profile 2 | spread | marked unstable | passes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["values"]
        print(f"| {r['figure']} | {a:.4g} | {b:.4g} | {r['spread']:.1%} | "
              f"{'yes' if r['marked_unstable'] else 'no'} | {'yes' if r['passes'] else 'NO'} |")
    failed = [r["figure"] for r in rows if not r["passes"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} figures pass"
          + (f"; not: {', '.join(failed)}" if failed else ""))
    for n in (1, 2):
        lacks = [path for path, lacking in missing.items() if n in lacking]
        if lacks:
            print(f"not compared, missing in profile {n}: {', '.join(lacks)}")


if __name__ == "__main__":
    main()
