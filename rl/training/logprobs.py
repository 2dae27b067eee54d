"""Per-token log-probabilities of a causal LM on packed rows of token ids: sequences side by side, or prefix trees."""

import contextlib

import torch
from tensordict import TensorDict
from torch.utils.checkpoint import checkpoint


def selective_log_softmax(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[targets] in float32 without keeping a float32 log_softmax of the whole vocab.

    logits: [..., V] any float dtype, targets: [...] long -> [...] float32.
    """
    logits = logits.float()
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)  # [...]
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) in float32, without gradient. [..., V] -> [...]."""
    with torch.no_grad():
        logits = logits.float()
        log_z = torch.logsumexp(logits, dim=-1)  # [...]
        return log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def _head_log_softmax(
    lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden: [N,H], targets: [N] -> ([N] float32 logprobs, [N] entropies or [0]) through the output layer."""
    logits = lm_head(hidden)  # [N,V]
    entropy = entropy_of_logits(logits) if with_entropy else logits.new_zeros(0, dtype=torch.float32)
    return selective_log_softmax(logits, targets), entropy


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    parents: torch.Tensor | None = None,
    subtree_end: torch.Tensor | None = None,
    chunk_size: int = 512,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-probability of each token given its prefix; 0.0 wherever position_ids == 0.

    Rows may pack several sequences: each restarts its position ids at 0, and with attention_mask=None
    transformers turns the position ids into a block-diagonal causal mask. use_cache=False matters: with a
    cache object the packed-sequence detection is skipped and sequences would attend to each other.
    Rows may instead hold prefix trees (`rl.packing.prefix_tree`): `parents` [B,L] (the column whose output
    predicts each token, -1 for none) and `subtree_end` [B,L] (the tree attention mask, built for the model's
    attention implementation by `tree_attention_mask`); by default a token's parent is the column before it.
    With `mask` ([B,L] bool, e.g. the trained tokens) only the tokens where it is True get a logprob (0.0
    elsewhere): the output layer and the float32 log-softmax run on those positions alone, which saves
    most of their cost when prompts are long or rows are padded. They run over `chunk_size` positions at
    a time; under autograd each chunk is recomputed in backward instead of being kept, so memory stays
    bounded for a large vocab. With `return_entropy`, also the (gradient-free) entropy of the predictive
    distribution of each token [B,L], 0.0 where position_ids == 0 or outside `mask`.
    """
    if isinstance(model, LogprobsModel):  # sharded: the forward must run through the root unit
        return model(
            input_ids, position_ids, mask=mask, parents=parents, subtree_end=subtree_end, return_entropy=return_entropy
        )
    # input_ids, position_ids: [B,L]
    columns = torch.arange(input_ids.shape[1], device=input_ids.device)  # [L]
    if parents is None:
        parents = torch.where(position_ids > 0, columns - 1, -1)  # [B,L]
    if subtree_end is None:
        hidden = model.get_decoder()(
            input_ids=input_ids, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # [B,L,H]
    else:
        hidden = _tree_forward(model, input_ids, position_ids, subtree_end)  # [B,L,H]
    used = parents >= 0 if mask is None else mask & (parents >= 0)  # [B,L]: tokens whose logprob is computed
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(parents)  # [B,L]
    picked_hidden = hidden[rows[used], parents[used]]  # [N,H]: token t is predicted by its parent's output
    picked_targets = input_ids[used]  # [N]
    lm_head = model.get_output_embeddings()
    recompute = torch.is_grad_enabled() and picked_hidden.requires_grad
    chunks, entropies = [], []
    for start in range(0, max(1, picked_targets.shape[0]), chunk_size):  # an empty chunk keeps the result in the graph
        # [C,H], [C]
        chunk_hidden, chunk_targets = (
            picked_hidden[start : start + chunk_size],
            picked_targets[start : start + chunk_size],
        )
        if recompute:  # the [C,V] logits are recomputed in backward, not kept
            picked, entropy = checkpoint(
                _head_log_softmax, lm_head, chunk_hidden, chunk_targets, return_entropy, use_reentrant=False
            )
        else:
            picked, entropy = _head_log_softmax(lm_head, chunk_hidden, chunk_targets, return_entropy)
        chunks.append(picked)
        entropies.append(entropy)

    def scatter(values: list[torch.Tensor]) -> torch.Tensor:
        """[N] values at the used positions -> [B,L], 0.0 elsewhere."""
        return torch.zeros(used.shape, dtype=torch.float32, device=input_ids.device).masked_scatter(
            used, torch.cat(values)
        )

    logprobs = scatter(chunks)
    if not return_entropy:
        return logprobs
    return logprobs, scatter(entropies)


FLEX_WIDTH_MULTIPLE = 128
"""FlexAttention rows are padded to a multiple of its block size: each width compiles its own kernels, so a run meets
at most seq_len / 128 widths instead of a new one at almost every step."""


def _tree_forward(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, subtree_end: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden state [B,L,H] of prefix-tree rows [B,L].

    With "flex_attention" the rows are padded to `FLEX_WIDTH_MULTIPLE` (a padding column attends to itself alone and
    no real column attends to it) and FlexAttention is compiled for static shapes: transformers compiles it with
    automatic dynamic shapes, and torch 2.11's inductor found no kernel for the dynamic-shape graph
    (NoValidChoicesError at the second width a trainer meets, seen on an H200: docs/gpus-and-clusters.md).
    """
    width = input_ids.shape[1]
    flex = model.config._attn_implementation == "flex_attention"
    padding = -width % FLEX_WIDTH_MULTIPLE if flex else 0
    if padding:
        columns = torch.arange(width, width + padding, device=input_ids.device).expand(input_ids.shape[0], -1)
        input_ids = torch.nn.functional.pad(input_ids, (0, padding))
        position_ids = torch.nn.functional.pad(position_ids, (0, padding))
        subtree_end = torch.cat([subtree_end, columns + 1], dim=1)  # [B,L+P]
    static = torch._dynamo.config.patch(automatic_dynamic_shapes=False, recompile_limit=64)
    with static if flex else contextlib.nullcontext():
        hidden = model.get_decoder()(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            attention_mask=tree_attention_mask(model, subtree_end),
        ).last_hidden_state  # [B,L+P,H]
    return hidden[:, :width]


def tree_attention_mask(model: torch.nn.Module, subtree_end: torch.Tensor) -> torch.Tensor | object:
    """The prefix-tree mask: query q attends to key k iff k <= q < subtree_end[k] (its own prefix, itself included).

    subtree_end: [B,L]. For "sdpa" a [B,1,L,L] bool mask (True = attend), which transformers passes to
    torch's SDPA as it is; for "flex_attention" a BlockMask built from the same rule (its GPU path).
    """
    implementation = model.config._attn_implementation
    batch, length = subtree_end.shape
    if implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        def tree(b, h, q, k):
            return (k <= q) & (q < subtree_end[b, k])

        return create_block_mask(tree, batch, None, length, length, device=subtree_end.device)
    if implementation != "sdpa":
        raise ValueError(
            f"prefix-tree attention needs attn_implementation 'sdpa' or 'flex_attention', not {implementation!r}"
        )
    columns = torch.arange(length, device=subtree_end.device)
    # [B,1,L(q),L(k)]
    return ((columns[None, :] <= columns[:, None]) & (columns[:, None] < subtree_end[:, None, :]))[:, None]


def packed_logprobs(
    model: torch.nn.Module, micro_batch: TensorDict, *, mask: torch.Tensor, return_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` of a packed micro-batch's logical tokens [B,L], through its prefix-tree layout when it has one.

    The tree forward gives each node's logprob [B,F]; every logical token takes its node's (a gather, whose
    backward sums the gradients of the samples sharing a node). `mask` [B,L] selects the logical tokens needed.
    """
    if "fwd_input_ids" not in micro_batch:
        return token_logprobs(
            model, micro_batch["input_ids"], micro_batch["position_ids"], mask=mask, return_entropy=return_entropy
        )
    index = micro_batch["fwd_index"]  # [B,L] forward column of each logical token
    # [B,F]
    node_mask = (
        torch.zeros_like(micro_batch["fwd_input_ids"], dtype=torch.int8).scatter_reduce(
            1, index, mask.to(torch.int8), "amax"
        )
        > 0
    )
    out = token_logprobs(
        model,
        micro_batch["fwd_input_ids"],
        micro_batch["fwd_position_ids"],
        mask=node_mask,
        parents=micro_batch["fwd_parent"],
        subtree_end=micro_batch["fwd_subtree_end"],
        return_entropy=return_entropy,
    )
    start = micro_batch["position_ids"] == 0  # [B,L]: first tokens and padding have no logprob
    logical = [
        torch.where(start | ~mask, 0.0, values.gather(1, index)) for values in (out if return_entropy else (out,))
    ]
    return tuple(logical) if return_entropy else logical[0]


class LogprobsModel(torch.nn.Module):
    """A causal LM whose forward is `token_logprobs`: the root unit of a sharded model (see `rl.training.distributed.shard`)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None = None,
        parents: torch.Tensor | None = None,
        subtree_end: torch.Tensor | None = None,
        return_entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(
            self.lm,
            input_ids,
            position_ids,
            mask=mask,
            parents=parents,
            subtree_end=subtree_end,
            return_entropy=return_entropy,
        )
