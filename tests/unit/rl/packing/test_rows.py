import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

from rl.packing.rows import TrainSample, component_counts, pack_samples, split_micro_batches, trim_padding
from rl.training.logprobs import token_logprobs


def _hand_samples() -> list[TrainSample]:
    return [
        TrainSample([11, 12, 13], [False, True, True], [0.0, -0.1, -0.2], advantages=1.0, policy_version=3),
        TrainSample([21, 22, 23, 24, 25], [False, False, True, True, True], [0.0, 0.0, -0.3, -0.4, -0.5], -0.5, 2),
        TrainSample([31, 32], [False, True], [0.0, -0.6], advantages=2.0, policy_version=3),
        # a multi-turn sample: the environment's token 43 sits between two sampled tokens
        TrainSample([41, 42, 43, 44], [False, True, False, True], [0.0, -0.7, 0.0, -0.8], 0.25, 1),
    ]


def test_pack_samples_first_fit_decreasing_hand_example() -> None:
    # Lengths 3, 5, 2, 4 into rows of 8, longest first: s1 (5) opens row 0 (3 left); s3 (4) does not fit there
    # and opens row 1 (4 left); s0 (3) fills row 0; s2 (2) goes to row 1, which ends with 2 pads.
    batch = pack_samples(_hand_samples(), seq_len=8, pad_token_id=0)

    assert batch.batch_size == torch.Size([2])
    assert batch["input_ids"].tolist() == [[21, 22, 23, 24, 25, 11, 12, 13], [41, 42, 43, 44, 31, 32, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 1, 0, 0]]
    F, T = False, True
    assert batch["loss_mask"].tolist() == [[F, F, T, T, T, F, T, T], [F, T, F, T, F, T, F, F]]
    torch.testing.assert_close(
        batch["sampling_logprobs"],
        torch.tensor([[0.0, 0.0, -0.3, -0.4, -0.5, 0.0, -0.1, -0.2], [0.0, -0.7, 0.0, -0.8, 0.0, -0.6, 0.0, 0.0]]),
        atol=0,
        rtol=0,
    )
    assert batch["advantages"].tolist() == [
        [-0.5, -0.5, -0.5, -0.5, -0.5, 1.0, 1.0, 1.0],
        [0.25, 0.25, 0.25, 0.25, 2.0, 2.0, 0.0, 0.0],
    ]
    assert batch["policy_version"].tolist() == [[2, 2, 2, 2, 2, 3, 3, 3], [1, 1, 1, 1, 3, 3, -1, -1]]
    assert batch["input_ids"].dtype == torch.long and batch["position_ids"].dtype == torch.long
    assert batch["loss_mask"].dtype == torch.bool
    assert batch["sampling_logprobs"].dtype == torch.float32 and batch["advantages"].dtype == torch.float32
    # row 0: 3 + 2 trained tokens, row 1: 2 + 1
    assert component_counts([batch])[0].tolist() == [8.0, 4.0]  # rl: 8 weighted tokens in 4 sequences


def test_pack_samples_rejects_too_long_sample() -> None:
    long_sample = TrainSample(list(range(9)), [False] + [True] * 8, [0.0] * 9, advantages=1.0, policy_version=0)
    with pytest.raises(ValueError, match=r"sample 1 has 9 tokens, more than seq_len=8"):
        pack_samples([_hand_samples()[0], long_sample], seq_len=8, pad_token_id=0)


def test_train_sample_validation() -> None:
    with pytest.raises(ValueError, match="lengths differ"):
        TrainSample([1, 2, 3], [False, True], [0.0, 0.0, 0.0], advantages=0.0, policy_version=0)
    with pytest.raises(ValueError, match="first token"):
        TrainSample([1, 2], [True, True], [0.0, 0.0], advantages=0.0, policy_version=0)


def test_split_micro_batches_keeps_row_order() -> None:
    # Five full-length samples: one per row, ties keep the input order, so row i holds sample i.
    samples = [TrainSample([i] * 4, [False, True, True, i % 2 == 0], [0.0] * 4, float(i), 0) for i in range(5)]
    batch = pack_samples(samples, seq_len=4, pad_token_id=99)
    micro_batches = split_micro_batches(batch, 2)

    assert [mb.batch_size[0] for mb in micro_batches] == [2, 2, 1]
    assert [mb["input_ids"][:, 0].tolist() for mb in micro_batches] == [[0, 1], [2, 3], [4]]
    # trained tokens per row: 3, 2, 3, 2, 3
    assert component_counts(micro_batches)[0, 0] == 13
    with pytest.raises(ValueError, match="micro_batch_size"):
        split_micro_batches(batch, 0)


def _tiny_model(kind: str, attn_implementation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    config = Qwen3Config(**common) if kind == "qwen3" else LlamaConfig(**common)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    return model.eval()


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_packed_logprobs_equal_separate_logprobs(kind: str, attn_implementation: str) -> None:
    model = _tiny_model(kind, attn_implementation)
    generator = torch.Generator().manual_seed(1)
    samples = [
        TrainSample(torch.randint(1, 100, (n,), generator=generator).tolist(), [False] * n, [0.0] * n, 0.0, 0)
        for n in (3, 5, 2, 4)
    ]
    batch = pack_samples(samples, seq_len=8, pad_token_id=0)
    # Layout from the hand example above: row 0 = s1 [0:5] + s0 [5:8]; row 1 = s3 [0:4] + s2 [4:6] + 2 pads.
    placement = {1: (0, 0), 0: (0, 5), 3: (1, 0), 2: (1, 4)}

    with torch.no_grad():
        packed = token_logprobs(model, batch["input_ids"], batch["position_ids"])  # [2,8]
        for i, sample in enumerate(samples):
            ids = torch.tensor([sample.input_ids])
            separate = token_logprobs(model, ids, torch.arange(ids.shape[1])[None])[0]
            row, start = placement[i]
            torch.testing.assert_close(packed[row, start : start + len(separate)], separate, atol=1e-5, rtol=0)
            assert separate[0] == 0.0 and (separate[1:] < 0).all()
    assert packed[1, 6:].tolist() == [0.0, 0.0]  # padding


def test_token_logprobs_chunking_matches_plain_log_softmax_with_gradients() -> None:
    model = _tiny_model("qwen3", "sdpa")
    input_ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(2))
    position_ids = torch.arange(7).expand(2, 7)

    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits  # [2,7,100]
    reference = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    reference = torch.cat([torch.zeros(2, 1), reference], dim=1)  # [2,7]
    reference_grad = torch.autograd.grad(reference.sum(), model.lm_head.weight)[0]

    chunked = token_logprobs(model, input_ids, position_ids, chunk_size=4)  # chunks of 4 + 2 positions
    chunked_grad = torch.autograd.grad(chunked.sum(), model.lm_head.weight)[0]

    torch.testing.assert_close(chunked, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked_grad, reference_grad, atol=1e-6, rtol=0)
    assert chunked.dtype == torch.float32


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_masked_logprobs_equal_full_logprobs_on_the_mask_with_gradients(kind: str) -> None:
    """The output layer on the masked positions only: same values and the same gradients as the full pass."""
    model = _tiny_model(kind, "sdpa")
    samples = [
        TrainSample(list(range(3, 3 + n)), [False] * p + [True] * (n - p), [0.0] * n, 0.0, 0)
        for n, p in ((5, 2), (3, 1), (6, 4))
    ]
    batch = pack_samples(samples, seq_len=8, pad_token_id=0)
    mask = batch["loss_mask"]

    full = token_logprobs(model, batch["input_ids"], batch["position_ids"])
    full_loss = torch.where(mask, full, 0.0).sum()
    full_grads = torch.autograd.grad(full_loss, [model.lm_head.weight, model.model.layers[0].mlp.up_proj.weight])

    masked = token_logprobs(model, batch["input_ids"], batch["position_ids"], mask=mask, chunk_size=3)
    masked_grads = torch.autograd.grad(masked.sum(), [model.lm_head.weight, model.model.layers[0].mlp.up_proj.weight])

    assert int(mask.sum()) == 3 + 2 + 2
    torch.testing.assert_close(masked, torch.where(mask, full, 0.0), atol=1e-6, rtol=0)
    for masked_grad, full_grad in zip(masked_grads, full_grads):
        torch.testing.assert_close(masked_grad, full_grad, atol=1e-6, rtol=0)
    _, full_entropy = token_logprobs(model, batch["input_ids"], batch["position_ids"], return_entropy=True)
    _, masked_entropy = token_logprobs(model, batch["input_ids"], batch["position_ids"], mask=mask, return_entropy=True)
    torch.testing.assert_close(masked_entropy, torch.where(mask, full_entropy, 0.0), atol=1e-6, rtol=0)


def test_trim_padding_drops_only_columns_that_are_padding_in_every_row() -> None:
    samples = [TrainSample([i] * n, [False] + [True] * (n - 1), [0.0] * n, 0.0, 0) for i, n in enumerate((5, 3, 2))]
    batch = pack_samples(samples, seq_len=8, pad_token_id=99)  # rows: [5 + 3 | pad], [2 | 6 pads]
    trimmed = trim_padding(batch)
    assert trimmed.batch_size == batch.batch_size and trimmed["input_ids"].shape == (2, 8)
    batch = pack_samples(samples[1:], seq_len=8, pad_token_id=99)  # rows: [3 + 2 | 3 pads]
    trimmed = trim_padding(batch)
    assert trimmed["input_ids"].tolist() == [[1, 1, 1, 2, 2]]
    for key in batch.keys():
        assert torch.equal(trimmed[key], batch[key][:, :5]), key


def test_token_entropy_matches_the_softmax_entropy() -> None:
    model = _tiny_model("qwen3", "sdpa")
    input_ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6]])
    logprobs, entropy = token_logprobs(model, input_ids, position_ids, chunk_size=4, return_entropy=True)
    logits = model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[:, :-1]  # [2,6,100]
    expected = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    expected = torch.where(position_ids[:, 1:] == 0, 0.0, expected)
    torch.testing.assert_close(entropy[:, 1:], expected.detach(), atol=1e-5, rtol=0)
    assert entropy[:, 0].tolist() == [0.0, 0.0] and entropy[0, 4] == 0.0
    torch.testing.assert_close(logprobs, token_logprobs(model, input_ids, position_ids, chunk_size=4))


def test_packing_check_fails_loudly_on_a_misaligned_stream() -> None:
    from rl.packing.rows import check_packing

    samples = _hand_samples()
    batch = pack_samples(samples, seq_len=8, pad_token_id=0)
    shifted = batch.clone()
    shifted["sampling_logprobs"] = torch.roll(shifted["sampling_logprobs"], 1, dims=1)  # off by one token
    with pytest.raises(AssertionError, match="sampling_logprobs' misaligned"):
        check_packing(shifted, samples)
    weighted_pad = batch.clone()
    weighted_pad["ce_weights"][1, 7] = 1.0  # row 1 ends with padding
    with pytest.raises(AssertionError, match="'ce_weights' has weight on padding"):
        check_packing(weighted_pad, samples)
    assert batch["sequence_ids"].tolist() == [[1, 1, 1, 1, 1, 0, 0, 0], [3, 3, 3, 3, 2, 2, -1, -1]]
