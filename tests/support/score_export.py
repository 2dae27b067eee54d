"""Score token sequences with an exported model folder as a user would, in a process where rlmesh cannot be imported.

    python tests/support/score_export.py MODEL_DIR SEQUENCES_JSON ENGINE [ENGINE ...]    (ENGINE: transformers, vllm, peft)

SEQUENCES_JSON holds a list of token-id lists; stdout gets one JSON object {engine: [[logprob of token i given
tokens < i, for i >= 1], ...]}. The project's packages are blocked (`sys.modules[name] = None`) before anything
else is imported, so a folder that needs rlmesh code fails there. "peft" scores the export's PEFT adapter, MODEL_DIR/adapter,
on the base model its `adapter_config.json` names. Tests call `score_in_fresh_process`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT_PACKAGES = ("rl", "actors", "tasks", "rollouts", "rubrics", "env_types", "tools", "tests")


def score_in_fresh_process(
    model_dir: Path, sequences: list[list[int]], engines: list[str], scratch: Path
) -> dict[str, list[list[float]]]:
    """Run this file as a script on `model_dir` (the sequences go through a file in `scratch`)."""
    sequences_file = scratch / "sequences.json"
    sequences_file.write_text(json.dumps(sequences))
    result = subprocess.run(
        [sys.executable, __file__, str(model_dir), str(sequences_file), *engines],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def transformers_logprobs(model_dir: str, sequences: list[list[int]]) -> list[list[float]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(model_dir)  # the tokenizer loads too
    return causal_lm_logprobs(AutoModelForCausalLM.from_pretrained(model_dir).eval(), sequences)


def causal_lm_logprobs(model, sequences: list[list[int]]) -> list[list[float]]:
    import torch

    scored = []
    with torch.no_grad():
        for ids in sequences:
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1))
            scored.append(logprobs.squeeze(-1).tolist())
    return scored


def peft_logprobs(model_dir: str, sequences: list[list[int]]) -> list[list[float]]:
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(os.path.join(model_dir, "adapter")).eval()
    return causal_lm_logprobs(model, sequences)


def vllm_logprobs(model_dir: str, sequences: list[list[int]]) -> list[list[float]]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(os.path.join(model_dir, "config.json")) as file:
        dtype = json.load(file)["dtype"]  # vLLM's "auto" would serve a float32 folder in bf16
    llm = LLM(model=model_dir, dtype=dtype, enforce_eager=True, max_model_len=max(len(ids) for ids in sequences) + 8)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in sequences], params, use_tqdm=False)
    return [
        [position[token].logprob for position, token in zip(output.prompt_logprobs[1:], ids[1:])]
        for output, ids in zip(outputs, sequences)
    ]


def main() -> None:
    for package in PROJECT_PACKAGES:
        sys.modules[package] = None  # any import of the project raises ImportError
    model_dir, sequences_file, *engines = sys.argv[1:]
    with open(sequences_file) as file:
        sequences = json.load(file)
    score = {"transformers": transformers_logprobs, "vllm": vllm_logprobs, "peft": peft_logprobs}
    result = {engine: score[engine](model_dir, sequences) for engine in engines}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
