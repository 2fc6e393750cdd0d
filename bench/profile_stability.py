"""Does `ratrain profile` repeat? Two profiles of this machine, figure by figure.

Runs `ratrain profile` twice (or reads two profile files), and for every figure the simulator
uses prints both values, their spread ((max - min) / median; a link by the times it predicts
for the measured sizes, contention by the slowdown it applies: sim/profile_repeats.py) and
whether either profile marked the figure as unstable in its notes. A figure passes when the
two agree within 10%, or when a profile marked it unstable (the simulator is told not to trust
it: an unstable contention is not applied).

    python bench/profile_stability.py [--profiles A.yaml B.yaml] [--repeats 3]
                                      [--out bench/results/profile_stability.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ratrain.profiling.ranks import LINK_SIZES
from ratrain.sim.profile import load_profile
from ratrain.sim.profile_repeats import TOLERANCE, figures, spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from peers import machine  # noqa: E402

# Descriptive figures the simulator does not use to time or size anything.
NOT_USED = ("device.memory_bytes", "device.cores", "devices_per_node", "measured[0].seq_len",
            "measured[0].micro_batch_size")


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


def compare(paths: list[Path]) -> list[dict]:
    profiles = [load_profile(str(p)) for p in paths]
    notes = [p.notes.get("stability", "") + " " + p.notes.get("other_work", "") for p in profiles]
    per_profile = [figures(p.to_dict(), LINK_SIZES) for p in profiles]
    rows = []
    for path, first in per_profile[0].items():
        if path in NOT_USED or path.startswith("groups"):
            continue
        s = max(spread([f[path][i] for f in per_profile]) for i in range(len(first)))
        marked = any(f"{path} spread" in n for n in notes)
        rows.append({"figure": path, "values": [f[path][-1] for f in per_profile],
                     "spread": s, "marked_unstable": marked,
                     "passes": s <= TOLERANCE or marked})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", nargs=2, metavar="FILE", help="two profiles to compare")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/profile_stability.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = compare(_profiles(args, Path(tmp)))
    Path(args.out).write_text(json.dumps({"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                                          "argv": sys.argv[1:], "rows": rows}, indent=2))
    print("| figure | profile 1 | profile 2 | spread | marked unstable | passes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["values"]
        print(f"| {r['figure']} | {a:.4g} | {b:.4g} | {r['spread']:.1%} | "
              f"{'yes' if r['marked_unstable'] else 'no'} | {'yes' if r['passes'] else 'NO'} |")
    failed = [r["figure"] for r in rows if not r["passes"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} figures pass"
          + (f"; not: {', '.join(failed)}" if failed else ""))


if __name__ == "__main__":
    main()
