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


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, *, chunk_size: int = 512, return_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-probability of each token given its prefix; 0.0 wherever position_ids == 0.

    Rows may pack several sequences: each restarts its position ids at 0, and with attention_mask=None
    transformers turns the position ids into a block-diagonal causal mask. use_cache=False matters: with a
    cache object the packed-sequence detection is skipped and sequences would attend to each other.
    The float32 log-softmax runs over `chunk_size` positions at a time ([B, chunk_size, V] floats); under
    autograd each chunk is recomputed in backward instead of being kept, so memory stays bounded for a
    large vocab either way. With `return_entropy`, also the (gradient-free) entropy of the predictive
    distribution of each token [B,L], 0.0 where position_ids == 0.
    """
    # input_ids, position_ids: [B,L]
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits  # [B,L,V]
    targets = input_ids[:, 1:]  # [B,L-1]: token t+1 is predicted by the logits at t
    recompute = torch.is_grad_enabled() and logits.requires_grad
    chunks, entropies = [], []
    for start in range(0, targets.shape[1], chunk_size):
        end = min(start + chunk_size, targets.shape[1])
        chunk_logits = logits[:, start:end]  # [B,C,V]
        chunk_targets = targets[:, start:end]  # [B,C]
        if return_entropy:
            entropies.append(entropy_of_logits(chunk_logits))
        if recompute:
            chunks.append(checkpoint(selective_log_softmax, chunk_logits, chunk_targets, use_reentrant=False))
        else:
            chunks.append(selective_log_softmax(chunk_logits, chunk_targets))
    first = torch.zeros(input_ids.shape[0], 1, dtype=torch.float32, device=input_ids.device)  # [B,1]
    logprobs = torch.cat([first, *chunks], dim=1)  # [B,L]
    # A sequence's first token has no prefix; in a packed row the logits before it belong to another sequence.
    logprobs = torch.where(position_ids == 0, 0.0, logprobs)
    if not return_entropy:
        return logprobs
    entropy = torch.where(position_ids == 0, 0.0, torch.cat([first, *entropies], dim=1))  # [B,L]
    return logprobs, entropy
