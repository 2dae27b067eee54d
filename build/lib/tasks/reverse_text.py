"""Reverse a short text character by character: single turn, partial credit by character similarity."""

from __future__ import annotations

import difflib
import random
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "music",
    "paper",
    "garden",
    "silver",
    "window",
    "orange",
    "planet",
    "bridge",
    "candle",
    "forest",
    "ocean",
    "pencil",
    "rocket",
    "tiger",
    "yellow",
    "violet",
    "summer",
    "winter",
    "mirror",
    "basket",
    "butter",
    "castle",
    "dragon",
    "engine",
    "falcon",
    "guitar",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "lemon",
    "marble",
    "needle",
    "pillow",
    "quartz",
    "rabbit",
    "saddle",
    "tunnel",
    "velvet",
    "wagon",
    "zipper",
    "anchor",
    "button",
    "copper",
    "desert",
    "feather",
    "glacier",
    "hammer",
    "ladder",
    "meadow",
    "nickel",
    "puzzle",
]

PROMPT = "Reverse the following text character by character. Reply with only the reversed text.\n\nText: {text}"


def char_similarity(rollout: Rollout, example: dict[str, Any]) -> float:
    """difflib's similarity ratio (2 * matching characters / total characters) of the reply and the reversed text."""
    return difflib.SequenceMatcher(None, rollout.last_assistant_text().strip(), example["answer"]).ratio()


class ReverseTextEnv(MessageEnv):
    def __init__(self, text: str):
        self.text = text

    async def reset(self) -> ResetOutput:
        return ResetOutput(messages=[{"role": "user", "content": PROMPT.format(text=self.text)}])

    async def step(self, assistant_message: Message) -> StepOutput:
        return StepOutput(done=True)


class ReverseTextTask(Task):
    """Texts of `min_words`..`max_words` words from a shipped list; seeded, distinct, disjoint splits."""

    row_fields = ("text", "answer")

    def __init__(
        self, num_train: int = 2000, num_validation: int = 64, min_words: int = 1, max_words: int = 3, seed: int = 0
    ):
        if not 1 <= min_words <= max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
        rng = random.Random(seed)
        texts: dict[str, None] = {}
        attempts = 0
        while len(texts) < num_train + num_validation:
            attempts += 1
            if attempts > 100 * (num_train + num_validation):
                raise ValueError(
                    f"cannot draw {num_train + num_validation} distinct texts of {min_words}-{max_words} words"
                )
            texts[" ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words)))] = None
        ordered = list(texts)
        self.splits = {"validation": ordered[:num_validation], "train": ordered[num_validation:]}

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [{"text": text, "answer": text[::-1]} for text in self.splits[split]]

    def target(self, example: dict[str, Any]) -> str | None:
        """The reversed text."""
        return example["answer"]

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        return ReverseTextEnv(example["text"])

    def build_rubric(self) -> Rubric:
        return Rubric([RewardFn(char_similarity)], truncation_reward=None, error_reward=0.0)
