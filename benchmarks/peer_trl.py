"""The TRL peer of the main job: TRL's GRPOTrainer on sum_digits with SmolLM2-135M-Instruct, matched to
configs/sum_digits_smollm2_cpu.toml, for comparing learning per step and speed with rlmesh.

Matched: the train rows in rlmesh's order for the seed (`rl.loop.data.RowStream` over `tasks.sum_digits`), the
chat prompt (the tokenizer's chat template; `--check-prompts` compares the token ids with an rlmesh run's), the
reward (last integer of the reply), 4 groups x 8 per step, one optimizer step per batch, AdamW lr 2e-5 constant,
betas 0.9/0.999, no weight decay, grad clip 1.0, clip eps 0.2/0.28, no std scaling, no KL, 24 new tokens,
temperature 1.0 (no top-k/top-p), fp32, no gradient checkpointing (TRL defaults it on), greedy eval on the 40 held-out rows every `--eval-every` steps.
Not matched, by design: TRL samples with HF `generate` in the trainer process (rlmesh: vLLM in its own process).

Needs TRL, which rlmesh's venv does not have; nothing in rlmesh imports this file. Setup (pip has the registry and
the torch +cpu find-links configured):

    python3.11 -m venv /work/peer-venv
    /work/peer-venv/bin/pip install torch==2.13.0+cpu      # first, so pip does not pull a CUDA torch
    /work/peer-venv/bin/pip install trl==1.16.0
    /work/peer-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # if pulled: CUDA builds

Run from the repository root (imports rlmesh's task and row stream, not its trainer):

    PYTHONPATH=$PWD /work/peer-venv/bin/python benchmarks/peer_trl.py --seed 0 --out runs/peer-s0.jsonl \
        [--check-prompts runs/<rlmesh run>/rollouts.jsonl]

Prints per-step wall time and the median; writes one JSON line per step (train reward mean, completion length,
grad norm, loss, step time; eval reward at eval steps) to `--out`.

`--replay runs/<rlmesh run> --replay-steps N` runs TRL's update on the samples rlmesh trained on, step by step, and
prints per step TRL's loss and grad norm next to rlmesh's, and the mean |logprob| gap between TRL's weights and the
rlmesh weights that drew that step's samples (vLLM's logprobs), next to how far one update moves them: equal
updates keep the gap at fp32 rounding. `--replay-save DIR` saves the model after the last replayed step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from rl.assets import smollm2_path
from rl.loop.data import RowStream
from tasks.sum_digits import SumDigitsTask, parse_last_integer

GROUPS_PER_STEP = 4
GROUP_SIZE = 8
MAX_NEW_TOKENS = 24


def messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """The conversation rlmesh's SumDigitsEnv starts (no system prompt: the template adds SmolLM2's default)."""
    return [{"role": "user", "content": row["prompt"]}]


def train_rows(task: SumDigitsTask, seed: int, steps: int) -> list[dict[str, Any]]:
    """The rows rlmesh draws for `steps` steps with this seed, in order (row stream of a single task)."""
    stream = RowStream({"sum_digits": task.load_dataset("train")}, {"sum_digits": 1.0}, seed=seed)
    return [row for _, row in stream.take(steps * GROUPS_PER_STEP)]


DRAWN: list[int] = []
"""The numbers of the last scored batch, one per group, to record which rows each step trained on."""


def digit_sum_reward(
    completions: list[list[dict[str, str]]], answer: list[int], number: list[int], **_: Any
) -> list[float]:
    """1 when the last integer of the reply is the digit sum (rlmesh's `digit_sum_correct`)."""
    DRAWN[:] = number[::GROUP_SIZE]
    return [float(parse_last_integer(c[-1]["content"]) == a) for c, a in zip(completions, answer, strict=True)]


def check_prompts(tokenizer: Any, rollouts_path: Path) -> int:
    """Assert that the chat template gives the prompt token ids an rlmesh run sampled from; returns rows checked."""
    checked = 0
    for line in rollouts_path.open():
        record = json.loads(line)
        ids = tokenizer.apply_chat_template(messages(record["example"]), add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
        expected = record["rollout"]["turns"][0]["prompt_token_ids"]
        if ids != expected:
            raise SystemExit(
                f"prompt ids differ for {record['example']['prompt']!r}:\n peer   {ids}\n rlmesh {expected}"
            )
        checked += 1
    return checked


def replay_rlmesh_steps(trainer: Any, run_dir: Path, steps: int, save: Path | None = None) -> list[dict[str, float]]:
    """TRL's loss and pre-clip grad norm on the samples rlmesh trained on at steps 1..`steps` of `run_dir`, each
    followed by TRL's own optimizer step (AdamW, clip 1.0) on them.

    The samples of step k were drawn from rlmesh's weights after k-1 steps, so TRL's numbers match rlmesh's
    logged ones at every step only if both trainers make the same update from the same samples: the same token
    masks, advantages, loss normalisation, clipping and optimizer.
    """
    from trl.trainer.utils import pad

    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").open()]
    logged = {m["step"]: m for m in map(json.loads, (run_dir / "metrics.jsonl").open()) if "train/grad_norm" in m}
    pad_id = trainer.processing_class.pad_token_id
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    optimizer = trainer.create_optimizer()
    rows = []
    for step in range(1, steps + 1):
        groups: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            if record["kind"] == "train" and record["step"] == step:
                groups.setdefault(record["rollout"]["group_id"], []).append(record["rollout"])
        prompts, completions, advantages = [], [], []
        for rollouts in groups.values():
            rewards = torch.tensor([r["reward"] for r in rollouts], dtype=torch.float32)
            advantages += (rewards - rewards.mean()).tolist()  # scale_rewards="none"
            for rollout in rollouts:
                prompts.append(torch.tensor(rollout["turns"][0]["prompt_token_ids"]))
                completions.append(torch.tensor(rollout["turns"][0]["completion_token_ids"]))
        completion_mask = pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")
        inputs = {
            "prompt_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
            "prompt_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
            "completion_ids": pad(completions, padding_value=pad_id, padding_side="right"),
            "completion_mask": completion_mask,
            "advantages": torch.tensor(advantages),
            "num_items_in_batch": completion_mask.sum(),
        }
        before = completion_logprobs(trainer.model, prompts, completions)
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
        after = completion_logprobs(trainer.model, prompts, completions)
        sampled = torch.cat(
            [torch.tensor(r["turns"][0]["completion_logprobs"]) for rollouts in groups.values() for r in rollouts]
        )
        rows.append(
            {
                "step": step,
                "trl_loss": loss.item(),
                "rlmesh_loss": logged[step]["loss"],
                "trl_grad_norm": float(norm),
                "rlmesh_grad_norm": logged[step]["train/grad_norm"],
                # the policies themselves: TRL's weights before this update against the rlmesh weights that sampled
                # (vLLM's logprobs), on the same scale as what one update moves them
                "logprob_gap_to_rlmesh_sampler": (before - sampled).abs().mean().item(),
                "logprob_change_of_one_update": (after - before).abs().mean().item(),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    if (
        save is not None
    ):  # the policy after `steps` updates: rlmesh's own weights at that version, to sample from elsewhere
        trainer.model.save_pretrained(save)
        trainer.processing_class.save_pretrained(save)
    return rows


@torch.no_grad()
def completion_logprobs(model: Any, prompts: list[torch.Tensor], completions: list[torch.Tensor]) -> torch.Tensor:
    """Each completion token's logprob under `model` given its prompt and the tokens before it, all samples concatenated."""
    out = []
    for prompt, completion in zip(prompts, completions):
        ids = torch.cat([prompt, completion])[None]  # [1, T]
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # [C, V]
        out.append(logits.log_softmax(-1).gather(-1, completion[:, None])[:, 0])
    return torch.cat(out)


@torch.no_grad()
def greedy_eval(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out greedy reward: one unpadded generate per row, so no padding can change a greedy path."""
    was_training = model.training
    model.eval()
    rewards, lengths = [], []
    for row in rows:
        ids = tokenizer.apply_chat_template(
            messages(row), add_generation_prompt=True, tokenize=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(
            **ids,
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        completion = out[0, ids["input_ids"].shape[1] :]
        rewards.append(
            float(parse_last_integer(tokenizer.decode(completion, skip_special_tokens=True)) == row["answer"])
        )
        lengths.append(len(completion))
    model.train(was_training)
    return {"eval/reward_mean": statistics.fmean(rewards), "eval/completion_length": statistics.fmean(lengths)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--eval-every", type=int, default=7, help="0: no eval")
    parser.add_argument(
        "--loss-type", default="dapo", help="TRL loss_type; dapo = global token mean (rlmesh's token-mean)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True, help="JSONL, one line per step")
    parser.add_argument(
        "--check-prompts", type=Path, help="an rlmesh run's rollouts.jsonl to compare prompt token ids with"
    )
    parser.add_argument(
        "--replay", type=Path, help="an rlmesh run dir: TRL's updates on its samples, step by step; then exit"
    )
    parser.add_argument("--replay-steps", type=int, default=1)
    parser.add_argument("--replay-save", type=Path, help="save the model after the replayed steps here")
    args = parser.parse_args()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    model_path = str(smollm2_path())
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if args.check_prompts:
        print(f"prompt token ids identical to rlmesh's for {check_prompts(tokenizer, args.check_prompts)} rows")

    task = SumDigitsTask(num_digits=2, num_validation=40)
    rows = train_rows(task, args.seed, args.steps)
    validation = task.load_dataset("validation")
    dataset = Dataset.from_list(
        [{"prompt": messages(row), "answer": row["answer"], "number": row["number"]} for row in rows]
    )

    config = GRPOConfig(
        output_dir=str(args.out.parent / f"{args.out.stem}-trl"),
        seed=args.seed,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # TRL's default is True; rlmesh's main job does not checkpoint
        max_steps=args.steps,
        per_device_train_batch_size=GROUPS_PER_STEP * GROUP_SIZE,
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=2e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="none",
        beta=0.0,
        loss_type=args.loss_type,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.open("w")

    class Recorder(TrainerCallback):
        """Per-step wall time, TRL's logged metrics and the held-out eval, one JSON line per step."""

        def __init__(self) -> None:
            self.started = 0.0
            self.step_times: list[float] = []
            self.record: dict[str, Any] = {}

        def evaluate(self, step: int) -> dict[str, float]:
            metrics = greedy_eval(trainer.model, tokenizer, validation)
            print(f"step {step}: eval reward {metrics['eval/reward_mean']:.3f}", flush=True)
            return metrics

        def on_step_begin(self, args_: Any, state: Any, control: Any, **_: Any) -> None:
            self.started = time.perf_counter()

        def on_step_end(self, args_: Any, state: Any, control: Any, **_: Any) -> None:
            self.step_times.append(time.perf_counter() - self.started)
            self.record = {"step": state.global_step, "time/step_s": self.step_times[-1]}

        def on_log(self, args_: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any) -> None:
            if not logs or "reward" not in logs:
                return
            step = state.global_step
            self.record.update(
                {
                    "reward_mean": logs["reward"],
                    "completion_length": logs.get("completions/mean_length"),
                    "grad_norm": float(logs["grad_norm"]),
                    "loss": logs.get("loss"),
                    "clip_ratio": logs.get("clip_ratio/region_mean"),
                    "truncation_rate": logs.get("completions/clipped_ratio"),
                    "entropy": logs.get("entropy"),
                    "lr": logs.get("learning_rate"),
                    "numbers": list(DRAWN),
                }
            )
            if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
                self.record.update(self.evaluate(step))
            out.write(json.dumps(self.record) + "\n")
            out.flush()
            r = self.record
            print(
                f"step {step}: {r['time/step_s']:.1f} s, reward {r['reward_mean']:.3f}, length {r['completion_length']:.1f}, "
                f"grad_norm {r['grad_norm']:.3f}",
                flush=True,
            )

    recorder = Recorder()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=digit_sum_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    if args.replay:
        replay_rlmesh_steps(trainer, args.replay, args.replay_steps, args.replay_save)
        return
    if args.eval_every:
        out.write(json.dumps({"step": 0, **recorder.evaluate(0)}) + "\n")
        out.flush()
    trainer.train()
    out.close()
    print(
        f"median step {statistics.median(recorder.step_times):.2f} s over {len(recorder.step_times)} steps (wall incl. generation)"
    )


if __name__ == "__main__":
    main()
