"""The layouts bench/schedules.py runs: a pipeline degree pp, a data-parallel degree dp and a
rank order, as `--configs` writes them (1x2, 2x2:pp-dp, 2x2:dp-pp); bench/schedules_report.py
bounds and tables each run by its layout."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ratrain.errors import UserError

ORDERS = ("pp-dp", "dp-pp")


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    order: str = "pp-dp"

    @property
    def world(self) -> int:
        return self.pp * self.dp

    @property
    def key(self) -> str:
        return f"{self.pp}x{self.dp}" + (f":{self.order}" if self.pp > 1 and self.dp > 1 else "")

    @property
    def name(self) -> str:
        return f"pp={self.pp} dp={self.dp}" + (f" {self.order}" if self.pp > 1 and self.dp > 1 else "")


def parse_layouts(text: str, default_order: str) -> list[Layout]:
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)(?::(pp-dp|dp-pp))?", item.strip())
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise UserError(f"--configs: {item.strip()!r} is not PPxDP or PPxDP:ORDER "
                            f"(e.g. 1x2, 2x2:dp-pp)")
        out.append(Layout(int(m[1]), int(m[2]), m[3] or default_order))
    return out
