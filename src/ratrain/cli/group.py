"""The `ratrain` command group every command file registers on."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ratrain")
def cli() -> None:
    """ratrain: pipeline + data-parallel training of LLaMA-family models on small-memory,
    slow-link clusters.

    Run `ratrain train` with no arguments for the built-in default: a tiny model on the text of
    Python's standard library, about two and a half minutes on two CPU cores.
    """
