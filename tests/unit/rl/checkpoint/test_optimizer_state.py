"""The optimizer state a checkpoint is loaded into is made one parameter at a time, equal to what torch's own
`get_state_dict` makes with one zero-gradient step over all parameters (which holds every gradient at once)."""

import copy

import torch
from torch.distributed.checkpoint.state_dict import _init_optim_state

from rl.checkpoint.store import init_optimizer_state


def adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))


def test_the_state_is_torchs_own_and_no_weight_moves():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
    reference = copy.deepcopy(model)
    ours, theirs = adamw(model), adamw(reference)
    init_optimizer_state(ours)
    _init_optim_state(theirs)
    assert ours.state_dict()["param_groups"] == theirs.state_dict()["param_groups"]  # the learning rate restored
    for mine, its in zip(ours.state_dict()["state"].values(), theirs.state_dict()["state"].values(), strict=True):
        assert mine.keys() == its.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key in mine:
            torch.testing.assert_close(mine[key], its[key], rtol=0, atol=0)
    for mine, its in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, its, rtol=0, atol=0)  # lr 0: the decay leaves them as they were
        assert mine.grad is None


def test_each_step_holds_one_gradient():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    optimizer = adamw(model)
    step, held = optimizer.step, []

    def counting_step(*args, **kwargs):
        held.append(sum(parameter.grad is not None for parameter in model.parameters()))
        return step(*args, **kwargs)

    optimizer.step = counting_step
    init_optimizer_state(optimizer)
    assert held == [1, 1, 1, 1]  # 2 weights and 2 biases, one at a time


def test_an_optimizer_with_a_state_is_left_alone():
    model = torch.nn.Linear(4, 4)
    optimizer = adamw(model)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    before = copy.deepcopy(optimizer.state_dict())
    init_optimizer_state(optimizer)
    assert str(optimizer.state_dict()) == str(before)
