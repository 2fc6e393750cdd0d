"""The setup stage: a run config (and an optional plan file) in, a checked plan out.

    entry      run_plan, the one entry: the config's values, the rule, the schedule, the plan
    rule       what can run: one rule for training, the planner's search and the CLI
    choice     --schedule auto: the fastest simulated schedule that fits
    plan_file  a plan file read once and checked against the run
    memory_fit the plan's predicted bytes against the machine's memory, before a run starts
"""

from ratrain.setup.entry import Machine, run_plan
from ratrain.setup.memory_fit import check_memory_fits
from ratrain.setup.plan_file import read_plan_file

__all__ = ["Machine", "check_memory_fits", "read_plan_file", "run_plan"]
