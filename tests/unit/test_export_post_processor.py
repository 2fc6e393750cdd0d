"""A tokenizer.json whose post-processor adds a BOS: the run never applies it (documents are
joined by the eos id alone) and says so at its start; the export writes the tokenizer without
it, so that AutoTokenizer encodes a text to the ids the model was trained on."""

import yaml
from tokenizers import AddedToken, Tokenizer, processors
from transformers import AutoTokenizer

from ratrain.data.tokenizer import load_tokenizer

from .cli_runner import run_cli, run_cli_ok, small_config

TEXT = "def x(y):\n    return y"


def _bos_tokenizer(monkeypatch, capsys, tmp_path):
    small_config(tmp_path)  # its corpus, tmp_path/text
    run_cli_ok(monkeypatch, capsys, "tokenizer", "--data", "text", "--vocab-size", "300",
               "--out", "tok/")
    path = tmp_path / "tok" / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens([AddedToken("<s>", special=True)])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="$A $B",
                                                       special_tokens=[("<s>", bos)])
    tok.save(str(path))
    return path, bos


def test_a_bos_adding_post_processor_is_said_and_left_out_of_the_export(monkeypatch, capsys,
                                                                        tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RATRAIN_CACHE", str(tmp_path / "cache"))
    path, bos = _bos_tokenizer(monkeypatch, capsys, tmp_path)
    config = small_config(tmp_path, steps=1)
    cfg = yaml.safe_load(config.read_text())
    cfg["model"]["vocab_size"] = 320
    config.write_text(yaml.safe_dump(cfg))
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(config), "--tokenizer",
                           str(path), "--run-dir", "run", "--threads", "1", "--no-report")
    assert code == 0, err
    assert err.count("its post-processor, which adds <s> to every text, is not applied") == 1

    said = run_cli_ok(monkeypatch, capsys, "export", "run", "--out", "hf")
    assert "written without its post-processor, which adds <s>" in said
    ours = load_tokenizer(str(path)).encode(TEXT)
    assert bos not in ours
    assert AutoTokenizer.from_pretrained(tmp_path / "hf")(TEXT).input_ids == ours
    # the run's own copy is still the file it was given
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == path.read_bytes()
