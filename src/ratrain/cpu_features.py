"""What the CPU's instruction set says of its bfloat16 matrix products: the `cpu-local` preset
prices bf16 15x slower than fp32, as measured on AVX2-only cores, where cores with AVX-512 BF16
or AMX train bf16 at 0.9-1.7x fp32's tokens/s (docs/machines.md). Pure Python, below
everything: the machine a run is planned for (training/prepare.py, the CLI's searches)."""

from __future__ import annotations

from pathlib import Path

BF16_MATMUL_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of bf16 matrix instructions, the faster first."""


def bf16_matmul_flag(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first of BF16_MATMUL_FLAGS this CPU has; None where it has none or cannot say."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:  # not Linux
        return None
    flags = next((set(line.split(":", 1)[1].split()) for line in lines
                  if line.startswith("flags")), set())
    return next((f for f in BF16_MATMUL_FLAGS if f in flags), None)
