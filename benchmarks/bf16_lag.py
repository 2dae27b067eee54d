"""How far a bf16 forward's policy falls behind the fp32 policy of the same weights as small updates accumulate.

The model's fp32 weights (bf16 values, as loaded from its bf16 checkpoint) take `k` steps of `--lr` each, every weight in
the sign of the gradient of an advantage-weighted logprob (Adam's update at its steady state: about lr per weight, in
a consistent direction). At each `k` it prints train/mismatch_k3 between the fp32 policy and: the fp32 policy at k = 0
(how far the policy moved), bf16 autocast (weights rounded to nearest at each use), and the trainer's stochastically
rounded bf16 compute copy (`rl.training.compute_copy`). The tokens are the model's own samples of the main job's
prompts.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bf16_lag.py --lr 2e-7
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl.assets import resolve_model_path
from rl.training.compute_copy import ComputeCopy
from rl.training.logprobs import token_logprobs


def k3(train: torch.Tensor, sampler: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of exp(r) - 1 - r, r = train - sampler logprob, over the masked tokens (`train/mismatch_k3`)."""
    ratio = (train - sampler)[mask].double()
    return float((ratio.exp() - 1 - ratio).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lr", type=float, default=2e-7)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--steps", default="0,2,4,8,16")
    args = parser.parse_args()
    torch.manual_seed(0)
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is the sum of the digits of {n}? Answer with just the number."}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for n in range(10, 10 + args.samples)
    ]
    prompts = [tokenizer(text, add_special_tokens=False).input_ids for text in texts]
    width = max(map(len, prompts))
    left = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])  # [S, P] left-padded
    with torch.no_grad():
        out = model.generate(
            left, attention_mask=left != tokenizer.pad_token_id, do_sample=True, temperature=1.0, max_new_tokens=24
        )  # [S, P+24]
    ids = out.clone()
    attended = torch.cat([left != tokenizer.pad_token_id, torch.ones_like(out[:, width:], dtype=torch.bool)], 1)
    positions = (attended.cumsum(1) - 1).clamp_min(0)  # [S, T]: padding at position 0 has no logprob
    ids[~attended] = tokenizer.pad_token_id
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, width:] = True  # the completions
    advantages = torch.randn(len(prompts), 1)

    def logprobs(mode: str) -> torch.Tensor:
        with torch.no_grad():
            if mode == "autocast":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    return token_logprobs(model, ids, positions, mask=mask)
            if mode == "copy":
                copy.refresh()
                with copy.active():
                    return token_logprobs(model, ids, positions, mask=mask)
            return token_logprobs(model, ids, positions, mask=mask)

    (token_logprobs(model, ids, positions, mask=mask) * advantages * mask).sum().backward()
    parameters = list(model.parameters())
    start = [p.detach().clone() for p in parameters]
    direction = [p.grad.sign() for p in parameters]
    model.zero_grad(set_to_none=True)
    copy = ComputeCopy(model, torch.optim.SGD(parameters))
    base = logprobs("fp32")
    print(f"lr {args.lr:g} per step, every weight; {int(mask.sum())} sampled tokens; train/mismatch_k3 against fp32:")
    print("  k | fp32 at k=0 (moved) | bf16 autocast | bf16 compute copy")
    for k in map(int, args.steps.split(",")):
        with torch.no_grad():
            for parameter, first, sign in zip(parameters, start, direction, strict=True):
                parameter.copy_(first + k * args.lr * sign)
        fp32 = logprobs("fp32")
        print(
            f"{k:3d} | {k3(base, fp32, mask):.4f} | {k3(logprobs('autocast'), fp32, mask):.4f} | "
            f"{k3(logprobs('copy'), fp32, mask):.4f}"
        )


if __name__ == "__main__":
    main()
