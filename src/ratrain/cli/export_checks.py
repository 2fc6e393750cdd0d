"""`ratrain export`'s checks of what it pairs with the weights: the tokenizer (the run's own,
or a --tokenizer that is the one it trained with) and what a reader of the export needs."""

from __future__ import annotations

from pathlib import Path

import click

from ratrain.config import RunConfig
from ratrain.errors import UserError


def export_tokenizer(cfg: RunConfig, run_dir: Path, given: str | None, again: str):
    """The ExportTokenizer of the tokenizer the run trained with (`given`: the one named by
    --tokenizer, refused where it is not the run's), checked before the checkpoint is read;
    None for a run on a .bin of ids under the default tokenizer, which is no claim about where
    the ids came from."""
    from ratrain.data.hf_tokenizer import ExportTokenizer
    from ratrain.data.tokenizer import check_fits, load_tokenizer
    from ratrain.training.run_tokenizer import kept_tokenizer

    copy = kept_tokenizer(run_dir)  # the file it trained with
    spec = given or copy or cfg.data.tokenizer
    if given is None and copy is None and _on_ids(cfg):
        return None
    try:
        found = load_tokenizer(spec)
    except UserError as e:
        if given is not None or copy is not None:
            raise
        raise UserError(f"{e}; the run's config.yaml names it as its tokenizer: if it moved, "
                        f"export with `{again} --tokenizer FILE`") from None
    if given is not None:
        _refuse_another(cfg, run_dir, copy, given)
    check_fits(found, cfg.model.vocab_size)
    return ExportTokenizer(found)


def _on_ids(cfg: RunConfig) -> bool:
    """A run on a .bin of ids under the default tokenizer: which tokenizer made the ids is
    not known."""
    from ratrain.data.tokens import is_token_file

    return cfg.data.tokenizer == "byte" and is_token_file(cfg.data.path)


def _refuse_another(cfg: RunConfig, run_dir: Path, copy: str | None, given: str) -> None:
    """A --tokenizer other than the run's (until 2026-12-04 any was written beside the weights,
    unsaid: a byte run's model exported with a BPE's files, whose ids mean other text). The
    run's is its copy, RUN/tokenizer.json, else config.yaml's data.tokenizer, compared as a
    resume compares them (resume_settings.same_setting: the same file, or its bytes); unknown
    for a run on .bin ids, or where neither file is there any more (said)."""
    from ratrain.training.resume_settings import same_setting
    from ratrain.training.run_tokenizer import tokenizer_file

    recorded = cfg.data.tokenizer
    if copy is None and _on_ids(cfg):
        return
    own = copy or recorded
    source = tokenizer_file(own)
    if source is not None and not source.is_file():
        click.echo(f"note: --tokenizer {given}: the tokenizer {run_dir}/config.yaml names, "
                   f"{recorded}, is not there to compare it with, and the run kept no copy "
                   f"({run_dir}/tokenizer.json): exporting with {given} as the run's", err=True)
        return
    if not same_setting(("data", "tokenizer"), own, given):
        what = ("the byte tokenizer (config.yaml: tokenizer: byte)" if source is None
                else f"{source}" + (" (its copy)" if copy else ""))
        raise UserError(f"--tokenizer {given} is not the tokenizer {run_dir} trained with, "
                        f"{what}: its ids would mean other text; leave --tokenizer out to "
                        "export the run's own")


def baichuan_note(cfg: RunConfig) -> str | None:
    """Where the export is written as Baichuan (ALiBi or NormHead), which transformers itself
    does not load: said, so that the export is not taken for a plain transformers model."""
    import torch

    from ratrain.models.hf import BAICHUAN, hf_config

    m = cfg.model
    if hf_config(m, torch.float32)["architectures"] != [BAICHUAN]:
        return None
    whose = ("Baichuan2-13B's" if m.position == "alibi" and m.norm_head else
             "Baichuan-13B's" if m.position == "alibi" else "Baichuan2-7B's")
    return (f"note: this model ({m.position}{', NormHead' if m.norm_head else ''}) is written "
            "as Baichuan (model_type baichuan), which transformers' AutoModelForCausalLM does "
            f"not load by itself: it needs {whose} modeling_baichuan.py beside config.json (with "
            "an auto_map) and trust_remote_code=True; ratrain reads the export back as it is")
