"""Errors that mean the user asked for something we cannot do (CLI exit code 2)."""


class UserError(Exception):
    """A mistake in the user's input: bad flag, missing file, model/tokenizer mismatch.

    The CLI prints the message as one line on stderr and exits with code 2; anything else
    that escapes is an internal failure (exit code 1).
    """


class RunFailure(RuntimeError):
    """A run that could not go on for a reason its message states in full (a hung peer, a disk
    that filled): one line on stderr, exit code 1, no traceback."""
