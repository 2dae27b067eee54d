"""Per-token log-probabilities of a causal LM on (possibly packed) rows of token ids."""

import torch
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


def _head_log_softmax(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
    chunk_size: int = 512,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-probability of each token given its prefix; 0.0 wherever position_ids == 0.

    Rows may pack several sequences: each restarts its position ids at 0, and with attention_mask=None
    transformers turns the position ids into a block-diagonal causal mask. use_cache=False matters: with a
    cache object the packed-sequence detection is skipped and sequences would attend to each other.
    With `mask` ([B,L] bool, e.g. the trained tokens) only the tokens where it is True get a logprob (0.0
    elsewhere): the output layer and the float32 log-softmax run on those positions alone, which saves
    most of their cost when prompts are long or rows are padded. They run over `chunk_size` positions at
    a time; under autograd each chunk is recomputed in backward instead of being kept, so memory stays
    bounded for a large vocab. With `return_entropy`, also the (gradient-free) entropy of the predictive
    distribution of each token [B,L], 0.0 where position_ids == 0 or outside `mask`.
    """
    if isinstance(model, LogprobsModel):  # sharded: the forward must run through the root unit
        return model(input_ids, position_ids, mask=mask, return_entropy=return_entropy)
    # input_ids, position_ids: [B,L]
    hidden = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state  # [B,L,H]
    used = torch.ones_like(input_ids[:, 1:], dtype=torch.bool) if mask is None else mask[:, 1:]  # [B,L-1]: positions t whose next token is used
    picked_hidden = hidden[:, :-1][used]  # [N,H]
    picked_targets = input_ids[:, 1:][used]  # [N]: token t+1 is predicted by the output at t
    lm_head = model.get_output_embeddings()
    recompute = torch.is_grad_enabled() and picked_hidden.requires_grad
    chunks, entropies = [], []
    for start in range(0, max(1, picked_targets.shape[0]), chunk_size):  # an empty chunk keeps the result in the graph
        chunk_hidden, chunk_targets = picked_hidden[start : start + chunk_size], picked_targets[start : start + chunk_size]  # [C,H], [C]
        if recompute:  # the [C,V] logits are recomputed in backward, not kept
            picked, entropy = checkpoint(_head_log_softmax, lm_head, chunk_hidden, chunk_targets, return_entropy, use_reentrant=False)
        else:
            picked, entropy = _head_log_softmax(lm_head, chunk_hidden, chunk_targets, return_entropy)
        chunks.append(picked)
        entropies.append(entropy)
    first = torch.zeros(input_ids.shape[0], 1, dtype=torch.float32, device=input_ids.device)  # [B,1]

    def scatter(values: list[torch.Tensor]) -> torch.Tensor:
        """[N] values at the used positions -> [B,L], 0.0 elsewhere."""
        flat = torch.cat(values)
        shifted = torch.zeros(used.shape, dtype=torch.float32, device=input_ids.device).masked_scatter(used, flat)  # [B,L-1]
        # A sequence's first token has no prefix; in a packed row the output before it belongs to another sequence.
        return torch.where(position_ids == 0, 0.0, torch.cat([first, shifted], dim=1))  # [B,L]

    logprobs = scatter(chunks)
    if not return_entropy:
        return logprobs
    return logprobs, scatter(entropies)


class LogprobsModel(torch.nn.Module):
    """A causal LM whose forward is `token_logprobs`: the root unit of a sharded model (see `rl.training.distributed.shard`)."""

    def __init__(self, lm: torch.nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor | None = None, return_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(self.lm, input_ids, position_ids, mask=mask, return_entropy=return_entropy)
