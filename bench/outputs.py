"""Where a bench script writes its results file (--out) and its figure (--plot): a run sent
elsewhere with --out leaves the committed results and docs/ figures alone."""

from __future__ import annotations

import json
from pathlib import Path


def outputs(out: str | Path | None, plot: str | Path | None, default_out: Path,
            default_plot: Path) -> tuple[Path, Path | None]:
    """(results file, figure or None): --out, else `default_out`; --plot ('' for none), else
    beside the --out given (its name, .png), else `default_plot`."""
    result = Path(out) if out else default_out
    if plot is not None:
        return result, Path(plot) if str(plot) else None
    return result, result.with_suffix(".png") if out else default_plot


def write_results(out: Path, result: dict) -> None:
    """The results file, written and said."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


def draw(plot, result: dict, png: Path | None) -> None:
    """`plot(result, png)` where a figure is asked for (outputs' png), said."""
    if png:
        plot(result, png)
        print(f"wrote {png}")
