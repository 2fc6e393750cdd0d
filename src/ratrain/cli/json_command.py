"""A command whose `--json` prints an object on stdout when it is refused too: a script that
reads stdout gets `{"error": ...}` (still exit 2, the line on stderr) rather than nothing. Until
2026-12-04 only `plan` did; `simulate`, `report`, `profile`, `models` and `train` printed
nothing there."""

from __future__ import annotations

import json

import click

from ratrain.errors import UserError


def refusal_object(error: Exception) -> dict:
    """What --json prints for a refusal: the error's own object where it has one (plan's
    closest plan), else {"error": its line}."""
    return getattr(error, "json_object", None) or {"error": str(error)}


class JsonCommand(click.Command):
    """A command with a `--json` flag (as_json) that prints refusal_object on stdout for a
    UserError, and for click's own refusals (a value that is not a number, an unknown flag)."""

    def parse_args(self, ctx, args):
        given = list(args)  # (click's parser takes them from the list it is given)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if "--json" in given:
                click.echo(json.dumps({"error": e.format_message()}, indent=2))
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            if ctx.params.get("as_json"):
                click.echo(json.dumps(refusal_object(e), indent=2))
            raise
