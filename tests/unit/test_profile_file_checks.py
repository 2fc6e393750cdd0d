"""What a profile file may hold: a device that computes in some dtype, unit times that a unit
which computes can take, and notes that say what the file's `measured` holds."""

from __future__ import annotations

import copy

import pytest
import yaml

from ratrain.errors import UserError
from ratrain.profiling import measure
from ratrain.sim.profile import PRESET_DIR, load_profile

TIMES = {"forward_s": 1e-3, "backward_s": 2e-3, "backward_input_s": 1e-3,
         "backward_weight_s": 1e-3}


def _measured_profile() -> dict:
    data = yaml.safe_load((PRESET_DIR / "cpu-local.yaml").read_text())
    data["measured"] = [{"model": "tiny", "seq_len": 32, "micro_batch_size": 1,
                         "dtype": "float32", **{k: dict(TIMES) for k in
                                                ("embedding", "block", "head")},
                         "block_forward_no_grad_s": 8e-4}]
    return data


def _refusal(tmp_path, data) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserError) as e:
        load_profile(str(path))
    message = str(e.value)
    assert str(path) in message and "\n" not in message
    return message


def test_a_device_with_no_compute_rate_is_refused_at_load(tmp_path):
    data = _measured_profile()
    data["device"]["compute"] = {}
    assert "device.compute: empty" in _refusal(tmp_path, data)


def test_a_group_device_with_no_compute_rate_is_refused_at_load(tmp_path):
    data = _measured_profile()
    second = copy.deepcopy(data["device"])
    second["compute"] = {}
    data["groups"] = [{"name": "a", "count": 1, "device": data["device"]},
                      {"name": "b", "count": 1, "device": second}]
    assert "groups[1].device.compute: empty" in _refusal(tmp_path, data)


@pytest.mark.parametrize("where", [
    "embedding.forward_s", "block.forward_s", "head.forward_s", "embedding.backward_s",
    "block.backward_s", "head.backward_s", "block.backward_input_s",
    "block.backward_weight_s", "head.backward_input_s", "embedding.backward_weight_s",
    "block_forward_no_grad_s"])
@pytest.mark.parametrize("value", [0, 0.0])
def test_a_zero_time_of_a_unit_that_computes_is_refused(tmp_path, where, value):
    data = _measured_profile()
    holder, *key = where.split(".")
    if key:
        data["measured"][0][holder][key[0]] = value
    else:
        data["measured"][0][holder] = value
    assert f"measured[0].{where}: must be positive" in _refusal(tmp_path, data)


def test_a_zero_time_of_a_unit_that_is_unstable_is_refused(tmp_path):
    data = _measured_profile()
    data["unstable"] = {"slow": {"measured[0].block.forward_s": 2e-3},
                        "fast": {"measured[0].block.forward_s": 0.0}}
    assert "unstable.fast.measured[0].block.forward_s: must be positive" in \
        _refusal(tmp_path, data)


def test_only_the_halves_that_compute_nothing_may_be_zero(tmp_path):
    """The embedding's BI (its input is token ids) and a chunked head's BW (its BI runs the
    whole backward) are 0 where unit_costs.split_backward_s prices them; a block's are not."""
    data = _measured_profile()
    data["measured"][0]["embedding"]["backward_input_s"] = 0.0
    data["measured"][0]["head"]["backward_weight_s"] = 0.0
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    m = load_profile(str(path)).measured[0]
    assert (m.embedding.backward_input_s, m.head.backward_weight_s) == (0.0, 0.0)
    data["measured"][0]["block"]["backward_input_s"] = 0.0
    assert "measured[0].block.backward_input_s: must be positive" in _refusal(tmp_path, data)


def test_the_notes_name_a_second_measured_entry_only_where_there_is_one():
    few = measure.profile_config("tiny", 32, 1, "float32")
    assert measure.smaller_config(few) is None
    note = measure._notes(few, 1, "cpu")["measured"]
    assert "A second entry" not in note and "quarter of the tokens" not in note
    assert "No second entry: a quarter of the micro-batch's 32 tokens is under the 16" in note
    enough = measure.profile_config("tiny", 64, 1, "float32")
    assert measure.smaller_config(enough) is not None
    note = measure._notes(enough, 1, "cpu")["measured"]
    assert "A second entry: the same process's forwards and backwards" in note
    assert "No second entry" not in note
