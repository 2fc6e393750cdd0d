"""What ends a run early, each with its CLI exit code: the user's mistake (2), a stop asked
for (130 Ctrl-C, 143 SIGTERM), a rank that failed, a run that could not go on (1)."""


class UserError(Exception):
    """A mistake in the user's input: bad flag, missing file, model/tokenizer mismatch.

    The CLI prints the message as one line on stderr and exits with code 2; anything else
    that escapes is an internal failure (exit code 1).
    """


class Interrupted(Exception):
    """A stop signal stopped the run: `signum` 2, Ctrl-C, or 15, SIGTERM (a scheduler's); the
    CLI exits with 128 + signum, 130 or 143, as a shell reports a process the signal ended
    (a scheduler's requeue logic reads it). `kept_said`: the message says what the run keeps
    (the checkpoint --checkpoint-on-interrupt saved, or the newest before the stop)."""

    def __init__(self, message: str, kept_said: bool = False, signum: int = 2):
        super().__init__(message)
        self.kept_said = kept_said
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class RankFailed(Exception):
    """A rank of a run failed; `user_error`: because of the user's input (CLI exit code 2,
    else 1)."""

    def __init__(self, rank: int, message: str, user_error: bool = False):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.user_error = user_error


class RunFailure(RuntimeError):
    """A run that could not go on for a reason its message states in full (a hung peer, a disk
    that filled): one line on stderr, exit code 1, no traceback."""
