import math

import pytest
import torch
from torch import nn

from ratrain.config import TrainConfig
from ratrain.errors import UserError
from ratrain.runtime.optim import lr_at, make_optimizer, unit_parameters


def test_lr_warms_up_linearly_then_decays_by_cosine_to_min():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, steps=110)
    assert [lr_at(s, cfg) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 2)))
    assert lr_at(110, cfg) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_the_schedule_never_rises_above_the_peak_the_user_set():
    """Without min_lr the cosine ends at a tenth of lr (a fixed 3e-4 floor made lr 1e-4 rise
    to 2.9e-4 over a 6-step run on the GPU, 2026-11-26); a floor above lr is refused."""
    cfg = TrainConfig(lr=1e-4, warmup_steps=2, steps=12)
    lrs = [lr_at(s, cfg) for s in range(13)]
    assert max(lrs) == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1e-5)
    with pytest.raises(UserError, match="min_lr"):
        TrainConfig(lr=1e-4, min_lr=3e-4).validate()


def test_weight_decay_only_on_matrices():
    unit = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    opt = make_optimizer(unit_parameters(unit, set()), TrainConfig(weight_decay=0.1))
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {id(unit[0].weight)}


def test_shared_parameter_is_owned_by_the_first_unit_only():
    a = nn.Embedding(8, 4)
    b = nn.Linear(4, 8, bias=False)
    b.weight = a.weight
    owned: set[int] = set()
    assert len(unit_parameters(a, owned)) == 1
    assert unit_parameters(b, owned) == []
    assert make_optimizer([], TrainConfig()) is None


def test_per_unit_adamw_equals_one_adamw():
    torch.manual_seed(0)
    units = [nn.Linear(3, 3), nn.Linear(3, 2)]
    clones = [nn.Linear(3, 3), nn.Linear(3, 2)]
    for u, c in zip(units, clones):
        c.load_state_dict(u.state_dict())
    cfg = TrainConfig()
    per_unit = [make_optimizer(list(u.parameters()), cfg) for u in units]
    whole = make_optimizer([p for c in clones for p in c.parameters()], cfg)
    x = torch.randn(5, 3)
    for _ in range(3):
        for model, opts in ((units, per_unit), (clones, [whole])):
            model[1](model[0](x)).square().sum().backward()
            for o in opts:
                o.step()
                o.zero_grad()
    for u, c in zip(units, clones):
        for p, q in zip(u.parameters(), c.parameters()):
            assert torch.equal(p, q)
