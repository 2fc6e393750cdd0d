"""An export whose model vocabulary is larger than its tokenizer (the default run: preset tiny's
512 rows, the byte tokenizer's 257 tokens) loads in transformers and generates: ids past the
tokenizer are rows of the model like any other, and decode to nothing. Why no note is said at
every such gap (only at 4 times the tokenizer: data/tokenizer.unused_vocab_note): padded
vocabularies are the common case, not a mistake."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .test_export_tokenizer import _cli, _train


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))


def test_an_export_with_rows_past_its_tokenizer_loads_and_generates(monkeypatch, capsys,
                                                                      tmp_path):
    run = _train(monkeypatch, capsys, tmp_path, vocab_size=512)
    _cli(monkeypatch, capsys, "export", str(run), "--out", "hf")
    tok, config = AutoTokenizer.from_pretrained("hf"), AutoConfig.from_pretrained("hf")
    model = AutoModelForCausalLM.from_pretrained("hf").eval()
    assert (len(tok), config.vocab_size) == (257, 512)
    assert model.get_input_embeddings().num_embeddings == model.lm_head.out_features == 512
    unused = list(range(257, 512))
    with torch.no_grad():  # every id the head can give is one the embedding takes back
        logits = model(torch.tensor([unused])).logits
    assert logits.shape == (1, len(unused), 512) and torch.isfinite(logits).all()
    assert tok.decode(unused) == ""
    prompt = tok("def f(x):", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out.shape == (1, prompt.input_ids.shape[1] + 8)
    assert tok.decode(out[0]).startswith("def f(x):")
