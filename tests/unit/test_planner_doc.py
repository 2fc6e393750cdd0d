"""docs/planner.md's heterogeneous-cluster example, run as a reader would: its YAML saved as
two-groups.yaml and its `ratrain plan` command run on it. The YAML once lacked the description
every profile needs (the command was refused), and the split the page gave (7,3) was plan 3's,
not the best plan's; the page's text is what is checked here, so an edit of either shows."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ratrain.sim.profile import load_profile

from .cli_runner import run_cli_ok

DOC = Path(__file__).resolve().parents[2] / "docs" / "planner.md"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## Heterogeneous clusters")
    return text[start:text.index("\n## ", start + 1)]


def _best_plans_row(out: str) -> dict[str, str]:
    """Plan 1's row of the search's table, by column (columns are two spaces or more apart)."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "units per stage" in line)
    names = re.split(r"\s{2,}", lines[header].strip())
    row = next(line for line in lines[header + 1:] if line.startswith("1 "))
    return dict(zip(names, re.split(r"\s{2,}", row.strip()), strict=True))


def test_the_heterogeneous_example_plans_the_split_the_page_gives(monkeypatch, capsys,
                                                                   tmp_path):
    section = _section()
    yaml_text = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "two-groups.yaml").write_text(yaml_text)
    profile = load_profile(tmp_path / "two-groups.yaml")
    speed = {g.name: g.device.compute["bfloat16"].peak_flops for g in profile.groups}
    prose = " ".join(section.split())  # (the page wraps its sentences anywhere)
    command = re.search(r"`(ratrain plan [^`]*--profile two-groups\.yaml[^`]*)`", prose).group(1)
    claim = re.search(r"puts (\d+) units \([^)]*\) on the (\w+) device and (\d+) \([^)]*\) on "
                      r"the (\w+) one", prose)
    said = {claim.group(2): int(claim.group(1)), claim.group(4): int(claim.group(3))}

    monkeypatch.chdir(tmp_path)  # the command names the YAML as the page saves it
    out = run_cli_ok(monkeypatch, capsys, *shlex.split(command)[1:])
    groups = re.search(r"the best plan's stages on device groups: (.*)", out).group(1)
    units = _best_plans_row(out)["units per stage"].split(",")
    planned = dict(zip(groups.split(", "), map(int, units), strict=True))
    assert planned == said
    faster, slower = sorted(speed, key=speed.get, reverse=True)
    assert planned[faster] > planned[slower]
