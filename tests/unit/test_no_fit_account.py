"""The account of a search that found nothing says only what could be done: at --global-batch
1 no layout uses a second device (a stage needs a micro-batch of its own, a replica a
sequence), and a pinned --pp is kept in what more devices would fit, or named where only
another pipeline depth would."""

from __future__ import annotations

import dataclasses
import re

from ratrain.models.presets import get_preset
from ratrain.planner import account, search
from ratrain.planner.layouts import PlanRequest
from ratrain.sim.profile import load_profile

from .cli_runner import run_cli


def _request(budget: float, global_batch: int = 8, pp: tuple[int, ...] | None = None,
             devices: int = 2) -> PlanRequest:
    return PlanRequest(model=get_preset("tiny"), profile=load_profile("cpu-local"),
                       devices=devices, global_batch=global_batch, seq_len=256, budget=budget,
                       pipeline_degrees=pp)


def _devices_line(text: str) -> str:
    return next(line for line in text.splitlines() if "devices" in line and "would" in line)


def test_at_global_batch_one_more_devices_are_said_to_be_of_no_use():
    """They once read "even one unit per stage overfills, with its state sharded": neither a
    second stage nor a second replica can run on one sequence a step."""
    text = account.account(_request(20e6, global_batch=1))
    line = _devices_line(text)
    assert line.strip().startswith("more devices would not help: at global batch 1 no layout "
                                   "uses more than 1 device"), line
    assert "one unit per stage" not in text and "devices would fit" not in text
    assert not search.search(_request(20e6, global_batch=1, devices=8)).best


def test_a_pinned_pp_is_kept_in_the_devices_that_would_fit():
    """--pp 1 under 30 MB: 4 devices fit only with a deeper pipeline (they were named as
    fitting); with the pin, 8 replicas to shard the state over do."""
    request = _request(30e6, pp=(1,))
    line = _devices_line(account.account(request))
    named = int(re.search(r"(\d+) devices would fit \(more replicas", line)[1])
    assert named == 8, line
    assert search.search(dataclasses.replace(request, devices=named)).best
    assert not search.search(dataclasses.replace(request, devices=named // 2)).best


def test_where_only_another_pp_would_fit_the_account_says_to_leave_the_pin_out():
    request = _request(30e6, pp=(2,))
    line = _devices_line(account.account(request))
    found = re.search(r"(\d+) devices would fit with more pipeline stages than --pp 2 allows: "
                      r"leave --pp out", line)
    assert found, line
    more = dataclasses.replace(request, devices=int(found[1]))
    assert not search.search(more).best  # with the pin, those devices do not fit
    assert search.search(dataclasses.replace(more, pipeline_degrees=None)).best


def test_a_pinned_pp_deeper_than_the_batch_allows_is_refused_as_such(monkeypatch, capsys):
    """It was every layout's refusal: "raise global_batch or lower micro_batch_size/dp", which
    at --global-batch 1 are 1 already."""
    code, _, stderr = run_cli(monkeypatch, capsys, "plan", "--model", "tiny", "--profile",
                              "cpu-local", "--devices", "2", "--memory-budget", "20MB",
                              "--global-batch", "1", "--pp", "2")
    assert code == 2
    assert stderr.startswith("error: --pp 2 needs at least 2 micro-batches a step (one a "
                             "stage); --global-batch 1 gives at most 1"), stderr
    assert "lower micro_batch_size" not in stderr
