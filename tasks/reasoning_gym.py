"""Any reasoning-gym dataset as a task: its procedurally generated questions, scored by its own `score_answer`.

reasoning-gym (`pip install reasoning-gym`, offline) has 100+ generators of verifiable problems
(`create_dataset(name, size, seed, **config)`); each dataset scores an answer string against an
entry with `score_answer(answer, entry)` (1.0 right, partial credit for some, 0.0 wrong). The
answer is read from the reply's last `<answer>...</answer>` block (reasoning-gym's own
`extract_answer`), or is the last match of `answer_pattern`, or, with `answer_tag = ""`, the whole reply.

    [[tasks]]
    name = "reasoning_gym"
    args = { dataset = "basic_arithmetic", config = { min_terms = 2, max_terms = 2 }, seed = 0 }
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task

DEFAULT_SYSTEM_PROMPT = "default"
"""A name of one of reasoning-gym's `SYSTEM_PROMPTS` (which ask for `<answer>` tags), or the prompt itself."""


@functools.lru_cache(maxsize=8)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """A reasoning-gym dataset, built once per process (its entries are a pure function of seed and index)."""
    import reasoning_gym

    config = json.loads(config_json)
    try:
        return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)
    except Exception as exc:
        known = sorted(reasoning_gym.factory.DATASETS)
        hint = f"; known datasets: {', '.join(known)}" if name not in known else ""
        raise ValueError(f"reasoning-gym dataset {name!r} with config {config}: {exc}{hint}") from exc


def extract_answer(reply: str, answer_tag: str, answer_pattern: str | None = None) -> str | None:
    """The answer string of a reply: the last match of `answer_pattern` when given (None when none matches), else its
    last `<answer_tag>` block (reasoning-gym's `extract_answer`), else (`answer_tag` "") the whole reply stripped."""
    from reasoning_gym.utils import extract_answer as extract_tagged

    if answer_pattern is not None:
        matches = re.findall(answer_pattern, reply)
        return matches[-1] if matches else None
    return extract_tagged(reply, tag_name=answer_tag) if answer_tag else reply.strip()


def score_answer(
    rollout: Rollout,
    example: dict[str, Any],
    *,
    dataset: tuple[str, str, int, int],
    answer_tag: str,
    answer_pattern: str | None = None,
) -> float:
    """The dataset's own `score_answer` of the reply's answer, against the generator's entry when the row is one
    the task made (`index` and question match: its metadata as generated), else against the row itself (rows
    from `[tasks.data]` files). Module-level, so the rubric runs it in a worker process with a deadline.

    Some scorers raise on malformed text (an unparsable number, a float overflow): an answer the scorer cannot read is
    a wrong answer, reward 0.0, so a malformed reply is penalised like any other instead of dropping out of its group
    as a failed rollout. The scorer is then tried on the row's own answer: when that raises too, the row or the
    config is at fault and the error is raised, naming it."""
    generator = _dataset(*dataset)
    entry: dict[str, Any] = example
    index = example.get("index")
    if isinstance(index, int) and 0 <= index < dataset[3]:
        own = generator[index]
        if own["question"] == example["question"]:
            entry = own
    answer = extract_answer(rollout.last_assistant_text(), answer_tag, answer_pattern)
    try:
        return float(generator.score_answer(answer, entry))
    except Exception:
        _check_scorable(generator, entry, dataset[0])
        return 0.0  # the row scores its own answer: the model's answer was unreadable, a wrong answer


def _check_scorable(generator: Any, entry: dict[str, Any], name: str) -> None:
    """Raise, naming the row, when dataset `name`'s scorer cannot score the row's own answer (a broken row or config)."""
    try:
        generator.score_answer(str(entry["answer"]), entry)
    except Exception as exc:
        raise ValueError(
            f"reasoning-gym {name!r} cannot score the row {str(entry.get('question'))[:200]!r}: its scorer fails on"
            f" the row's own answer too ({type(exc).__name__}: {exc}); check the row and the task's config"
        ) from exc


class SinglePromptEnv(MessageEnv):
    """Single turn: an optional system prompt and the question; one answer ends it."""

    def __init__(self, messages: list[Message]):
        self.messages = messages

    async def reset(self) -> ResetOutput:
        return ResetOutput(messages=list(self.messages))

    async def step(self, assistant_message: Message) -> StepOutput:
        return StepOutput(done=True)


class ReasoningGymTask(Task):
    """Questions of reasoning-gym dataset `dataset` (options `config`), seeded by `seed`.

    The held-out split is the first `num_validation` distinct questions the generator gives, the
    training split the next `num_train` distinct questions not among them (disjoint by question
    text). A generator with fewer distinct questions than that fails here, saying how many it gave.
    """

    row_fields = ("question", "answer")

    def __init__(
        self,
        dataset: str,
        config: dict[str, Any] | None = None,
        seed: int = 0,
        num_train: int = 1000,
        num_validation: int = 64,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        prompt_template: str = "{question}",
        answer_tag: str = "answer",
        answer_pattern: str | None = None,
    ):
        """`system_prompt`: a reasoning-gym `SYSTEM_PROMPTS` name, the text itself, or None for none;
        `prompt_template`: the user message, `{question}` replaced; `answer_tag`: the tag the answer is read
        from ("" = the whole reply); `answer_pattern`: a regular expression whose last match in the reply is the
        answer (e.g. `-?\\d+`, the last integer), instead of the tag."""
        from reasoning_gym.utils import SYSTEM_PROMPTS

        if num_train < 1 or num_validation < 1:
            raise ValueError(f"num_train and num_validation must be >= 1, got {num_train} and {num_validation}")
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
        wanted = num_train + num_validation
        draws = 4 * wanted + 100
        self.dataset_key = (dataset, json.dumps(config or {}, sort_keys=True), seed, draws)
        """What `score_answer` rebuilds the dataset from in a worker process."""
        generator = _dataset(*self.dataset_key)
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        self.prompt_template = prompt_template
        self.answer_tag = answer_tag
        if answer_pattern is not None:
            try:
                re.compile(answer_pattern)
            except re.error as exc:
                raise ValueError(f"answer_pattern {answer_pattern!r} is not a regular expression: {exc}") from exc
            if re.compile(answer_pattern).groups > 1:
                raise ValueError(f"answer_pattern {answer_pattern!r} may have at most one group (the answer)")
        self.answer_pattern = answer_pattern
        self.entries: dict[int, dict[str, Any]] = {}
        validation: list[int] = []
        train: list[int] = []
        seen: set[str] = set()
        for index in range(draws):
            entry = generator[index]
            if entry["question"] in seen:
                continue
            seen.add(entry["question"])
            self.entries[index] = entry
            (validation if len(validation) < num_validation else train).append(index)
            if len(train) == num_train:
                break
        if len(train) < num_train:
            raise ValueError(
                f"reasoning-gym dataset {dataset!r} with config {config} gave {len(seen)} distinct questions in "
                f"{draws} draws, fewer than num_train + num_validation = {wanted}; ask for fewer rows"
            )
        self.splits = {"validation": validation, "train": train}

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [self._row(index) for index in self.splits[split]]

    def _row(self, index: int) -> dict[str, Any]:
        entry = self.entries[index]
        metadata = json.loads(json.dumps(entry.get("metadata", {}), default=repr))  # JSON-able for the logs
        return {"question": entry["question"], "answer": str(entry["answer"]), "index": index, "metadata": metadata}

    def target(self, example: dict[str, Any]) -> str | None:
        return str(example["answer"])

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        messages: list[Message] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": self.prompt_template.replace("{question}", example["question"])})
        return SinglePromptEnv(messages)

    def build_rubric(self) -> Rubric:
        scorer = functools.partial(
            score_answer, dataset=self.dataset_key, answer_tag=self.answer_tag, answer_pattern=self.answer_pattern
        )
        return Rubric([RewardFn(scorer, weight=1.0, name="score_answer")], error_reward=0.0)
