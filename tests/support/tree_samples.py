"""Training samples that share prefixes as GRPO groups and multi-turn rollouts do (what prefix-tree packing is for)."""

import torch

from rl.packing.rows import TrainSample


def grouped_samples(turns: int, seed: int, groups: int = 3, size: int = 4, vocab: int = 1000) -> list[TrainSample]:
    """`groups` groups of `size` samples sharing a prompt; with turns = 2, pairs of samples also share a first turn
    (sampled tokens, trained in both) and an environment reply, then diverge in their second turn."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    samples = []
    for group in range(groups):
        prompt = tokens(6 + group)
        first_turns = [tokens(3) + tokens(2) for _ in range(size // 2)]  # 3 sampled tokens, 2 environment tokens
        for k in range(size):
            completion = tokens(2 + k)
            ids = prompt + (first_turns[k // 2] if turns == 2 else []) + completion
            mask = [False] * len(prompt) + ([True] * 3 + [False] * 2 if turns == 2 else []) + [True] * len(completion)
            sampling = [float(-1 - torch.rand((), generator=generator)) if m else 0.0 for m in mask]
            samples.append(TrainSample(ids, mask, sampling, float(torch.randn((), generator=generator)), 0))
    return samples
