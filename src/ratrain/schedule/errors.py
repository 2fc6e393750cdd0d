"""Errors of the schedule layer.

Two kinds, because the CLI maps them to different exit codes: a plan the user asked for that
cannot exist (too few micro-batches, a bad partition) is the user's mistake (exit code 2); a
program that fails its checks after our own builders and passes made it is an internal bug
(exit code 1), unless the user wrote the program by hand.
"""

from ratrain.errors import UserError


class ScheduleError(Exception):
    """A program (or a request for one) is invalid; the message says why, and for a program
    that fails its checks it holds a step x stage table with the offending action marked."""


class ScheduleConfigError(ScheduleError, UserError):
    """The requested pipeline cannot be built from these settings (n_micro < pp, a bad layer
    partition, an unknown schedule name): a user error."""
