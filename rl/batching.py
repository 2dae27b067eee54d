"""Training samples and their packing into fixed-length rows, micro-batches and token counts."""

from dataclasses import dataclass

import torch
from tensordict import TensorDict


@dataclass
class TrainSample:
    """One trajectory as the trainer sees it, token-aligned with what the sampler produced.

    input_ids holds the whole trajectory (prompt and every turn); loss_mask is True on tokens sampled by the
    policy, the only trained ones; sampling_logprobs are the sampler's logprobs (0.0 on unsampled tokens).
    """

    input_ids: list[int]
    loss_mask: list[bool]
    sampling_logprobs: list[float]
    advantage: float
    policy_version: int

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError("TrainSample has no tokens")
        if len(self.loss_mask) != n or len(self.sampling_logprobs) != n:
            raise ValueError(
                f"TrainSample lengths differ: input_ids {n}, loss_mask {len(self.loss_mask)}, "
                f"sampling_logprobs {len(self.sampling_logprobs)}"
            )
        if self.loss_mask[0]:
            raise ValueError("the first token has no prefix and cannot be a trained token (loss_mask[0] is True)")


def pack_samples(samples: list[TrainSample], *, seq_len: int, pad_token_id: int) -> TensorDict:
    """Pack samples into rows of `seq_len` tokens by first-fit decreasing; returns a TensorDict of batch [R].

    Samples are placed longest first (ties by input order, so the result is deterministic) into the first
    row with room. Keys, all [R, seq_len]: input_ids, position_ids (restart at 0 for every sample),
    loss_mask, sampling_logprobs, advantages (the sample's advantage on each of its tokens), policy_version
    (per token, so rows may mix samples of different versions). Padding has position id 0, which makes each
    pad token a one-token sequence of its own in transformers' packed mask: real tokens never attend to it,
    and its logprob is 0. Padding has loss_mask False, zeros elsewhere and policy_version -1.
    """
    if not samples:
        raise ValueError("pack_samples got no samples")
    for i, sample in enumerate(samples):
        if len(sample.input_ids) > seq_len:
            raise ValueError(
                f"sample {i} has {len(sample.input_ids)} tokens, more than seq_len={seq_len}; "
                "filter over-long samples before packing"
            )
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].input_ids))
    rows: list[list[TrainSample]] = []
    free: list[int] = []
    for i in order:
        n = len(samples[i].input_ids)
        row = next((r for r, room in enumerate(free) if room >= n), None)
        if row is None:
            rows.append([])
            free.append(seq_len)
            row = len(rows) - 1
        rows[row].append(samples[i])
        free[row] -= n

    shape = (len(rows), seq_len)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    position_ids = torch.zeros(shape, dtype=torch.long)
    loss_mask = torch.zeros(shape, dtype=torch.bool)
    sampling_logprobs = torch.zeros(shape, dtype=torch.float32)
    advantages = torch.zeros(shape, dtype=torch.float32)
    policy_version = torch.full(shape, -1, dtype=torch.long)
    for r, row_samples in enumerate(rows):
        start = 0
        for sample in row_samples:
            end = start + len(sample.input_ids)
            input_ids[r, start:end] = torch.tensor(sample.input_ids, dtype=torch.long)
            position_ids[r, start:end] = torch.arange(end - start)
            loss_mask[r, start:end] = torch.tensor(sample.loss_mask, dtype=torch.bool)
            sampling_logprobs[r, start:end] = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
            advantages[r, start:end] = sample.advantage
            policy_version[r, start:end] = sample.policy_version
            start = end
    return TensorDict(
        {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "loss_mask": loss_mask,
            "sampling_logprobs": sampling_logprobs,
            "advantages": advantages,
            "policy_version": policy_version,
        },
        batch_size=[len(rows)],
    )


def split_micro_batches(batch: TensorDict, micro_batch_size: int) -> list[TensorDict]:
    """Consecutive micro-batches of `micro_batch_size` rows (the last one may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return list(batch.split(micro_batch_size, dim=0))


def count_loss_tokens(batches: list[TensorDict]) -> int:
    """Number of trained tokens over all micro-batches: the `num_loss_tokens` of `grpo_loss`.

    With data parallelism, all-reduce this count across ranks before using it.
    """
    return sum(int(batch["loss_mask"].sum()) for batch in batches)


def trim_padding(batch: TensorDict) -> TensorDict:
    """The batch without the padding columns every row ends with: [R, L] -> [R, L'], L' = longest row's real length.

    Position ids restart for every sample, so the real tokens' logits do not change; the trainer just
    stops computing on columns that are padding in every row.
    """
    real = batch["policy_version"] >= 0  # [R, L]
    columns = real.any(dim=0).nonzero()
    length = int(columns[-1]) + 1 if len(columns) else 1
    return TensorDict({key: value[:, :length] for key, value in batch.items()}, batch_size=batch.batch_size)
