"""Training samples and their packing into fixed-length rows and micro-batches.

A sample carries every per-token stream the loss needs, aligned with its input ids, so the trainer
stays algorithm-blind: which tokens feed which loss component (`rl`, `ce`, `ref_kl`) and with what
weight is decided when samples are built, not in the trainer.
"""

from dataclasses import dataclass

import torch
from tensordict import TensorDict

COMPONENTS = ("rl", "ce", "ref_kl")
"""The three loss components: policy gradient, cross-entropy, reverse KL to a reference/teacher."""

FORWARD_PREFIX = "fwd_"
"""Keys of the prefix-shared forward layout (`rl.packing.prefix_tree`): their own width, not the logical rows'."""

FLOAT_STREAMS = ("sampling_logprobs", "advantages", "rl_weights", "ce_weights", "ref_kl_weights", "ref_logprobs")


@dataclass
class TrainSample:
    """One trajectory as the trainer sees it, token-aligned with what the sampler produced.

    input_ids holds the whole trajectory (prompt and every turn); loss_mask is True on tokens sampled by a
    generator (where sampling_logprobs are real; 0.0 elsewhere). `advantages` is per token (a float is
    broadcast to every token). Component weights: `rl_weights` defaults to 1.0 on the sampled tokens,
    `ce_weights` and `ref_kl_weights` to 0.0; `ref_logprobs` (the reference or teacher's logprob of each
    token given its prefix) is needed where `ref_kl_weights` are nonzero.
    """

    input_ids: list[int]
    loss_mask: list[bool]
    sampling_logprobs: list[float]
    advantages: float | list[float]
    policy_version: int
    rl_weights: list[float] | None = None
    ce_weights: list[float] | None = None
    ref_kl_weights: list[float] | None = None
    ref_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n == 0:
            raise ValueError("TrainSample has no tokens")
        if isinstance(self.advantages, (int, float)):
            self.advantages = [float(self.advantages)] * n
        if self.rl_weights is None:
            self.rl_weights = [float(m) for m in self.loss_mask]
        self.ce_weights = self.ce_weights if self.ce_weights is not None else [0.0] * n
        self.ref_kl_weights = self.ref_kl_weights if self.ref_kl_weights is not None else [0.0] * n
        self.ref_logprobs = self.ref_logprobs if self.ref_logprobs is not None else [0.0] * n
        lengths = {"loss_mask": len(self.loss_mask), **{name: len(getattr(self, name)) for name in FLOAT_STREAMS}}
        if any(length != n for length in lengths.values()):
            raise ValueError(
                f"TrainSample lengths differ: input_ids {n}, " + ", ".join(f"{k} {v}" for k, v in lengths.items())
            )
        if self.loss_mask[0]:
            raise ValueError("the first token has no prefix and cannot be a trained token (loss_mask[0] is True)")
        if self.rl_weights[0] or self.ce_weights[0] or self.ref_kl_weights[0]:
            raise ValueError("the first token has no prefix: its component weights must be 0")
        if any(w and not m for w, m in zip(self.rl_weights, self.loss_mask)):
            raise ValueError("rl_weights are nonzero on a token without sampling logprobs (loss_mask False)")


def check_packable(samples: list, seq_len: int, packer: str) -> None:
    """A packer's input: at least one sample, none longer than a row."""
    if not samples:
        raise ValueError(f"{packer} got no samples")
    for i, sample in enumerate(samples):
        if len(sample.input_ids) > seq_len:
            raise ValueError(
                f"sample {i} has {len(sample.input_ids)} tokens, more than seq_len={seq_len}; filter over-long samples before packing"
            )


def pack_samples(samples: list[TrainSample], *, seq_len: int, pad_token_id: int) -> TensorDict:
    """Pack samples into rows of `seq_len` tokens by first-fit decreasing; returns a TensorDict of batch [R].

    Samples are placed longest first (ties by input order, so the result is deterministic) into the first
    row with room. Keys, all [R, seq_len]: input_ids, position_ids (restart at 0 for every sample),
    sequence_ids (the sample's index in `samples`, -1 on padding), loss_mask, policy_version (per token, so
    rows may mix versions) and the float streams of `TrainSample`. Padding has position id 0, which makes
    each pad token a one-token sequence of its own in transformers' packed mask: real tokens never attend to
    it, and its logprob is 0. Padding has loss_mask False, zero weights and policy_version -1.
    The packed batch is checked against the samples (`check_packing`) before it is returned.
    """
    check_packable(samples, seq_len, "pack_samples")
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].input_ids))
    rows: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = len(samples[i].input_ids)
        row = next((r for r, room in enumerate(free) if room >= n), None)
        if row is None:
            rows.append([])
            free.append(seq_len)
            row = len(rows) - 1
        rows[row].append(i)
        free[row] -= n

    batch = lay_out(samples, rows, width=seq_len, pad_token_id=pad_token_id)
    check_packing(batch, samples)
    return batch


def lay_out(samples: list[TrainSample], rows: list[list[int]], *, width: int, pad_token_id: int) -> TensorDict:
    """The logical layout: row r holds the samples `rows[r]` one after the other, padded to `width` tokens."""
    shape = (len(rows), width)
    tensors = {
        "input_ids": torch.full(shape, pad_token_id, dtype=torch.long),
        "position_ids": torch.zeros(shape, dtype=torch.long),
        "sequence_ids": torch.full(shape, -1, dtype=torch.long),
        "loss_mask": torch.zeros(shape, dtype=torch.bool),
        "policy_version": torch.full(shape, -1, dtype=torch.long),
        **{name: torch.zeros(shape, dtype=torch.float32) for name in FLOAT_STREAMS},
    }
    for r, row_samples in enumerate(rows):
        start = 0
        for i in row_samples:
            sample = samples[i]
            end = start + len(sample.input_ids)
            tensors["input_ids"][r, start:end] = torch.tensor(sample.input_ids, dtype=torch.long)
            tensors["position_ids"][r, start:end] = torch.arange(end - start)
            tensors["sequence_ids"][r, start:end] = i
            tensors["loss_mask"][r, start:end] = torch.tensor(sample.loss_mask, dtype=torch.bool)
            tensors["policy_version"][r, start:end] = sample.policy_version
            for name in FLOAT_STREAMS:
                tensors[name][r, start:end] = torch.tensor(getattr(sample, name), dtype=torch.float32)
            start = end
    return TensorDict(tensors, batch_size=[len(rows)])


def check_packing(batch: TensorDict, samples: list[TrainSample]) -> None:
    """Fail loudly unless every stream of every sample sits, whole and in order, where its sequence id says.

    Guards the alignment of the per-token streams with input_ids (a shifted stream would train silently on
    the wrong tokens) and that padding carries no weight.
    """
    seq_len = batch["input_ids"].shape[1]
    for key, value in batch.items():
        if key.startswith(FORWARD_PREFIX):
            continue
        if tuple(value.shape) != (batch.batch_size[0], seq_len):
            raise AssertionError(
                f"packed stream {key!r} has shape {tuple(value.shape)}, expected {(batch.batch_size[0], seq_len)}"
            )
    sequence_ids = batch["sequence_ids"]
    pad = sequence_ids < 0
    for name in ("rl_weights", "ce_weights", "ref_kl_weights"):
        if bool((batch[name][pad] != 0).any()):
            raise AssertionError(f"packed stream {name!r} has weight on padding")
    for i, sample in enumerate(samples):
        where = sequence_ids == i
        if int(where.sum()) != len(sample.input_ids):
            raise AssertionError(f"sample {i}: {int(where.sum())} packed tokens, expected {len(sample.input_ids)}")
        if batch["input_ids"][where].tolist() != sample.input_ids:
            raise AssertionError(f"sample {i}: packed input_ids differ from the sample's")
        if batch["position_ids"][where].tolist() != list(range(len(sample.input_ids))):
            raise AssertionError(f"sample {i}: packed position ids are not 0..{len(sample.input_ids) - 1}")
        if batch["loss_mask"][where].tolist() != list(sample.loss_mask):
            raise AssertionError(f"sample {i}: packed loss_mask misaligned")
        for name in FLOAT_STREAMS:
            expected = torch.tensor(getattr(sample, name), dtype=torch.float32)
            packed = batch[name][where]
            if not bool(((packed == expected) | (packed.isnan() & expected.isnan())).all()):
                raise AssertionError(f"sample {i}: packed stream {name!r} misaligned with input_ids")


def local_sequences(sequence_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense per-token sequence index [B,L] within a micro-batch (padding gets its own index) and the count."""
    unique, index = torch.unique(sequence_ids, return_inverse=True)
    return index, unique.numel()


def segments(micro_batch: TensorDict) -> tuple[torch.Tensor, int]:
    """`local_sequences` of a micro-batch, computed once and kept on it (`seq_index` [B,L], `seq_count`)."""
    if "seq_index" not in micro_batch:
        index, count = local_sequences(micro_batch["sequence_ids"])
        micro_batch["seq_index"] = index
        micro_batch.set_non_tensor("seq_count", count)
    return micro_batch["seq_index"], micro_batch.get_non_tensor("seq_count")


def segment_sum(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """Sum of `values` [B,L] per sequence -> [count]."""
    return torch.zeros(count, dtype=values.dtype, device=values.device).index_add(0, index.flatten(), values.flatten())


def component_counts(micro_batches: list[TensorDict]) -> torch.Tensor:
    """[3, 2] float64: per component (rl, ce, ref_kl), the number of tokens with weight != 0 and the number
    of sequences holding one, over the whole step (the loss normalizers: counts, never Σw, so a weight scales
    its token's gradient). Ranks all-reduce (sum) this one tensor."""
    counts = torch.zeros(len(COMPONENTS), 2, dtype=torch.float64)
    for micro_batch in micro_batches:
        index, count = segments(micro_batch)
        for c, name in enumerate(COMPONENTS):
            weighted = (micro_batch[f"{name}_weights"] != 0).double()  # [B,L]
            counts[c, 0] += weighted.sum().cpu()
            counts[c, 1] += (segment_sum(weighted, index, count) > 0).sum().cpu()
    return counts


def split_micro_batches(batch: TensorDict, micro_batch_size: int) -> list[TensorDict]:
    """Consecutive micro-batches of `micro_batch_size` rows (the last one may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return list(batch.split(micro_batch_size, dim=0))


def trim_padding(batch: TensorDict) -> TensorDict:
    """The batch without the padding columns every row ends with: [R, L] -> [R, L'], L' = longest row's real length.

    Position ids restart for every sample, so the real tokens' logits do not change; the trainer just
    stops computing on columns that are padding in every row. The forward layout of prefix-shared packing (`fwd_*` keys) is built without padding columns and kept as it is.
    """
    real = batch["sequence_ids"] >= 0  # [R, L]
    columns = real.any(dim=0).nonzero()
    length = int(columns[-1]) + 1 if len(columns) else 1
    trimmed = {key: value if key.startswith(FORWARD_PREFIX) else value[:, :length] for key, value in batch.items()}
    return TensorDict(trimmed, batch_size=batch.batch_size)
