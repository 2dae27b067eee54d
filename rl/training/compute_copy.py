"""A bf16 compute copy of the trainer's fp32 weights, stochastically rounded, so a bf16 forward sees every update.

RL's updates are mostly below bf16's rounding step (a weight of 0.05 has a spacing of 2.4e-4; AdamW at lr 2e-5 moves
it ~2e-5 a step). Rounded to nearest, as autocast casts them, the weights a bf16 forward computes with stay where they
were for many steps while the fp32 weights (and an fp32 sampler) move on: the bf16 policy lags the fp32 one by the
whole of that unseen progress, which no later step undoes. Rounded stochastically (up with the probability of the
remainder), each bf16 weight equals its fp32 weight in expectation: the lag becomes zero-mean noise the size of one
rounding step, drawn afresh after every optimizer step.

`ComputeCopy.active()` puts the copy in the parameters' place for the forward and backward passes (no cast at each
use, as autocast does); gradients arrive in bf16 and are summed into fp32 gradients of the master weights, which the
optimizer then updates as usual. The copy is drawn again only when the master weights have changed (after an optimizer
step, or a checkpoint load: `refresh`), so the no-grad pass and the update of one step compute with the same copy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

MANTISSA_DROP = 16
"""float32 -> bfloat16 drops the low 16 bits of the float32 bit pattern."""


def stochastic_round_bf16(values: torch.Tensor) -> torch.Tensor:
    """fp32 `values` rounded to bf16, up in magnitude with the probability of the dropped remainder (E[result] = values).

    Adds 16 uniformly random bits to the low half of each float32 bit pattern and truncates: a carry (the remainder
    plus the noise overflowing 2^16) happens with probability remainder / 2^16, and moves the value to its next bf16
    neighbour away from zero (through the exponent when it must). Exact bf16 values are returned unchanged."""
    bits = values.contiguous().view(torch.int32)  # same shape
    rounded = torch.empty_like(bits).random_()  # in place from here: one buffer, no temporaries of the weights' size
    rounded.bitwise_and_((1 << MANTISSA_DROP) - 1).add_(bits).bitwise_and_(~((1 << MANTISSA_DROP) - 1))
    return rounded.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are zero


class ComputeCopy:
    """The bf16 weights a single-process trainer computes with, over `model`'s fp32 parameters (the master weights the
    optimizer, checkpoints and weight sync see outside `active()`)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        """`optimizer`: the one that steps `model`'s parameters; each of its steps makes the copy stale."""
        self.parameters = [p for p in model.parameters() if p.dtype == torch.float32]
        self.copies: list[torch.Tensor] | None = None
        """None when the master weights changed since the copy was drawn (`refresh`)."""
        optimizer.register_step_post_hook(lambda *_: self.refresh())
        self.grads: list[torch.Tensor | None] = [None] * len(self.parameters)
        self.on = False
        for position, parameter in enumerate(self.parameters):
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(self._hook(position))

    def _hook(self, position: int):
        def add_to_master(parameter: torch.Tensor) -> None:
            """A bf16 gradient into the fp32 sum (per backward pass, as autocast's fp32 gradients accumulate)."""
            if not self.on:
                return
            grad = self.grads[position]
            self.grads[position] = parameter.grad.float() if grad is None else grad.add_(parameter.grad)
            parameter.grad = None

        return add_to_master

    def refresh(self) -> None:
        """The master weights changed (an optimizer step, a checkpoint loaded): the next `active()` draws a new copy."""
        self.copies = None

    def _draw(self) -> list[torch.Tensor]:
        """The copy of the current master weights, drawn once per change of them."""
        if self.copies is None:
            with torch.no_grad():
                self.copies = [
                    stochastic_round_bf16(parameter.data)
                    if parameter.requires_grad
                    else parameter.data.to(torch.bfloat16)
                    for parameter in self.parameters
                ]
        return self.copies

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The parameters hold the bf16 copy; forward and backward passes inside compute in bf16, and their gradients
        are the fp32 master weights' `.grad` (added to any they had) once the block ends."""
        copies = self._draw()
        masters = [parameter.data for parameter in self.parameters]
        held = [parameter.grad for parameter in self.parameters]  # [fp32 | None]
        for parameter, copy in zip(self.parameters, copies, strict=True):
            parameter.grad = None
            parameter.data = copy
        self.on = True
        try:
            yield
        finally:
            self.on = False
            for position, (parameter, master) in enumerate(zip(self.parameters, masters, strict=True)):
                parameter.data = master
                grad, before = self.grads[position], held[position]
                parameter.grad = before if grad is None else grad if before is None else before.add_(grad)
                self.grads[position] = None
