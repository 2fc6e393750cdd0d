"""matplotlib without a display, and how the report's pictures are saved."""

from __future__ import annotations

from pathlib import Path

DPI = 110


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    try:
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
    finally:  # a save that failed (a full disk) must not leave its figure open
        pyplot().close(fig)
    return path
