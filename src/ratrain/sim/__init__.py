"""Cost model, hardware profiles and the simulator: pure Python, no torch, no processes.

The simulator interprets the same per-rank programs (schedule/ir.py) the executor runs; the
cost model gives each action its duration on a hardware profile and its memory effect, in the
memory ledger's kinds.
"""
