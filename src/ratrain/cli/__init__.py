"""The `ratrain` command line.

Exit codes: 0 success, 2 a user's mistake (one clear line on stderr), 1 an internal failure.
"""

from __future__ import annotations

import errno
import os
import sys

import click

from ratrain.cli import plan_cmd, report_cmd, simulate_cmd, tools_cmd, train_cmd  # noqa: F401  (they register their commands)
from ratrain.cli.group import cli
from ratrain.errors import Interrupted, RankFailed, RunFailure, UserError

__all__ = ["cli", "main"]


def main() -> None:
    from ratrain.runtime.torchrun_env import under_torchrun

    # Set before CUDA starts: a plan sized to the budget failed on 4.6 GiB of fixed segments
    # reserved but unused (llama2-7b, H200, 2026-11-28); mapped segments grow to what is used.
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    code = _run()
    if under_torchrun():  # torch is loaded there: its teardown is what this skips
        from ratrain.runtime.launch import exit_without_teardown

        exit_without_teardown(code)
    sys.exit(code)


def _kept() -> str:
    """What a Ctrl-C'd `ratrain train` leaves, said after "interrupted"."""
    if sys.argv[1:2] != ["train"]:
        return ""
    return ("; the checkpoints it completed are kept (--checkpoint-on-interrupt saves one at "
            "Ctrl-C)")


def _run() -> int:
    """Run the command line; map what a user can cause to one line on stderr and an exit code."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:  # Ctrl-C in this process (click's name for it)
        click.echo(f"interrupted{_kept()}", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        _tell_the_other_ranks(e)
        return 2
    except RankFailed as e:
        click.echo(f"error: {e}", err=True)
        return 2 if e.user_error else 1
    except RunFailure as e:
        click.echo(f"error: {e}", err=True)
        return 1
    except Interrupted as e:
        click.echo(f"{e}{'' if e.kept_said else _kept()}", err=True)
        return e.exit_code
    except OSError as e:
        if e.filename is None:  # not about a path the user named: an internal failure
            raise
        click.echo(f"error: {e.filename}: {e.strerror or e}", err=True)
        # A full or failing disk is no mistake of the user's input
        return 1 if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO) else 2
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    return 0


def _tell_the_other_ranks(e: UserError) -> None:
    """Under torchrun, a rank stopped before training (its disk, data or checkpoints) tells the
    others why, joining them for that where it had not, so that they stop now and say it too
    (process_groups.stop_together) instead of waiting --comm-timeout for it. Where the others
    never come, the join's timeout ends the wait."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import torch.distributed as dist

    from ratrain.runtime.process_groups import StoppedWithAnother, join_world, stop_together

    if isinstance(e, StoppedWithAnother):
        return

    try:
        if not dist.is_initialized():
            join_world("auto", failed=str(e))
        else:
            stop_together(str(e))
    except UserError:
        pass  # its own message, which the caller says
    except Exception as other:  # noqa: BLE001 -- the others gone: the user's error comes first
        click.echo(f"(could not tell the other ranks: {other})", err=True)
