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


def _head_log_softmax(lm_head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """hidden: [N,H], targets: [N] -> [N] float32 logprobs through the output layer."""
    return selective_log_softmax(lm_head(hidden), targets)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Float32 log-probability of each token given its prefix; 0.0 wherever position_ids == 0.

    Rows may pack several sequences: each restarts its position ids at 0, and with attention_mask=None
    transformers turns the position ids into a block-diagonal causal mask. use_cache=False matters: with a
    cache object the packed-sequence detection is skipped and sequences would attend to each other.
    With `mask` ([B,L] bool, e.g. the loss mask) only the tokens where it is True get a logprob (0.0
    elsewhere): the output layer and the float32 log-softmax run on those positions alone, which saves
    most of their cost when prompts are long or rows are padded. The float32 log-softmax runs over
    `chunk_size` positions at a time; under autograd each chunk is recomputed in backward instead of
    being kept, so memory stays bounded for a large vocab either way.
    """
    # input_ids, position_ids: [B,L]
    recompute = torch.is_grad_enabled()
    if mask is None:
        logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[:, :-1]  # [B,L-1,V]
        targets = input_ids[:, 1:]  # [B,L-1]: token t+1 is predicted by the logits at t
        chunks = []
        for start in range(0, targets.shape[1], chunk_size):
            chunk_logits, chunk_targets = logits[:, start : start + chunk_size], targets[:, start : start + chunk_size]  # [B,C,V], [B,C]
            if recompute and logits.requires_grad:
                chunks.append(checkpoint(selective_log_softmax, chunk_logits, chunk_targets, use_reentrant=False))
            else:
                chunks.append(selective_log_softmax(chunk_logits, chunk_targets))
        shifted = torch.cat(chunks, dim=1)  # [B,L-1]
    else:
        hidden = model.get_decoder()(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state  # [B,L,H]
        used = mask[:, 1:]  # [B,L-1]: positions t whose next token is used
        picked_hidden = hidden[:, :-1][used]  # [N,H]
        picked_targets = input_ids[:, 1:][used]  # [N]
        lm_head = model.get_output_embeddings()
        chunks = []
        for start in range(0, picked_targets.shape[0], chunk_size):
            chunk_hidden, chunk_targets = picked_hidden[start : start + chunk_size], picked_targets[start : start + chunk_size]
            if recompute and chunk_hidden.requires_grad:  # the [C,V] logits are recomputed in backward, not kept
                chunks.append(checkpoint(_head_log_softmax, lm_head, chunk_hidden, chunk_targets, use_reentrant=False))
            else:
                chunks.append(_head_log_softmax(lm_head, chunk_hidden, chunk_targets))
        picked = torch.cat(chunks) if chunks else hidden.new_zeros(0, dtype=torch.float32)  # [N]
        shifted = torch.zeros(used.shape, dtype=torch.float32, device=input_ids.device).masked_scatter(used, picked)  # [B,L-1]
    first = torch.zeros(input_ids.shape[0], 1, dtype=torch.float32, device=input_ids.device)  # [B,1]
    logprobs = torch.cat([first, shifted], dim=1)  # [B,L]
    # A sequence's first token has no prefix; in a packed row the logits before it belong to another sequence.
    return torch.where(position_ids == 0, 0.0, logprobs)
