"""Keep a sorted list while names arrive over several turns (multi-turn, no tools).

Turn 1 gives a few names to sort; each later turn adds more and asks for the whole list again.
Each turn is scored by how close the reply's list is to the right one (difflib ratio over the
list items: 1 only for the exact list); the environment records that on the turn, and the
rubric averages it over the turns the row has (a turn never reached counts 0).
"""

from __future__ import annotations

import difflib
import random
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task

NAMES = [
    "Olivia",
    "Liam",
    "Emma",
    "Noah",
    "Ava",
    "Elijah",
    "Sophia",
    "Mateo",
    "Isabella",
    "Lucas",
    "Mia",
    "Levi",
    "Amelia",
    "Ezra",
    "Harper",
    "Asher",
    "Evelyn",
    "James",
    "Luna",
    "Leo",
    "Camila",
    "Aiden",
    "Gianna",
    "Grayson",
    "Elena",
    "Hudson",
    "Aria",
    "Ethan",
    "Ellie",
    "Jack",
    "Nora",
    "Owen",
    "Zoe",
    "Wyatt",
    "Hazel",
    "Henry",
    "Ivy",
    "Kai",
    "Ruby",
    "Miles",
    "Quinn",
    "Theo",
    "Uma",
    "Victor",
    "Wren",
    "Xavier",
    "Yara",
    "Zane",
    "Bella",
    "Caleb",
    "Daisy",
    "Felix",
    "Greta",
]
FIRST = "Sort these names alphabetically. Reply with just the sorted names, one per line.\n\n{names}"
MORE = "Add these names and reply with the full sorted list, one per line.\n\n{names}"


def reply_names(text: str) -> list[str]:
    """The names of a reply, one per line; list markers ("1.", "-") and blank lines ignored."""
    names = []
    for line in text.splitlines():
        name = line.strip().lstrip("-*0123456789.) ").strip()
        if name:
            names.append(name)
    return names


def list_score(text: str, expected: list[str]) -> float:
    return difflib.SequenceMatcher(None, reply_names(text), expected).ratio()


def expected_lists(example: dict[str, Any]) -> list[list[str]]:
    """The right list after each turn."""
    seen: list[str] = []
    lists = []
    for batch in example["batches"]:
        seen += batch
        lists.append(sorted(seen))
    return lists


def sorted_lists(rollout: Rollout, example: dict[str, Any]) -> float:
    """Mean over the row's turns of the list score of each reply (missing turns count 0)."""
    expected = expected_lists(example)
    texts = [(turn.assistant_message or {}).get("content") or "" for turn in rollout.turns[: len(expected)]]
    return sum(list_score(text, names) for text, names in zip(texts, expected)) / len(expected)


class AlphabetSortEnv(MessageEnv):
    def __init__(self, batches: list[list[str]]):
        self.expected = expected_lists({"batches": batches})
        self.batches = batches
        self.turn = 0

    async def reset(self) -> ResetOutput:
        return ResetOutput(messages=[{"role": "user", "content": FIRST.format(names="\n".join(self.batches[0]))}])

    async def step(self, assistant_message: Message) -> StepOutput:
        reward = list_score(assistant_message.get("content") or "", self.expected[self.turn])
        self.turn += 1
        if self.turn == len(self.batches):
            return StepOutput(done=True, reward=reward)
        message = {"role": "user", "content": MORE.format(names="\n".join(self.batches[self.turn]))}
        return StepOutput(messages=[message], done=False, reward=reward)


class AlphabetSortTask(Task):
    """Rows of `num_turns` batches of `names_per_turn` distinct names; seeded, disjoint held-out split.

    Set the task's `env.max_turns` to at least `num_turns`.
    """

    row_fields = ("batches",)

    def __init__(
        self,
        num_train: int = 2000,
        num_validation: int = 64,
        num_turns: int = 3,
        names_per_turn: int = 2,
        seed: int = 0,
    ):
        if num_turns * names_per_turn > len(NAMES):
            raise ValueError(f"num_turns * names_per_turn must be <= {len(NAMES)}")
        rng = random.Random(seed)
        rows: dict[tuple[str, ...], list[list[str]]] = {}
        while len(rows) < num_train + num_validation:
            names = rng.sample(NAMES, num_turns * names_per_turn)
            batches = [names[i * names_per_turn : (i + 1) * names_per_turn] for i in range(num_turns)]
            rows.setdefault(tuple(names), batches)
        ordered = [{"batches": batches} for batches in rows.values()]
        self.splits = {"validation": ordered[:num_validation], "train": ordered[num_validation:]}

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [{"batches": [list(batch) for batch in row["batches"]]} for row in self.splits[split]]

    def target(self, example: dict[str, Any]) -> str | None:
        """The sorted list expected after each turn, one line per turn."""
        return "\n".join(", ".join(names) for names in expected_lists(example))

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        return AlphabetSortEnv(example["batches"])

    def build_rubric(self) -> Rubric:
        return Rubric([RewardFn(sorted_lists)], truncation_reward=None, error_reward=0.0)
