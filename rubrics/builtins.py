"""Ready-made reward functions, usable by name in a config's `rubric` table.

Each is `fn(rollout, example, **args)`; a config binds `args`, e.g.
`{ fn = "numeric_match", args = { tolerance = 0.01 } }`. They grade the last assistant
message, reading the reference answer from `example[answer_key]`.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from rollouts.types import Rollout
from rubrics.rubric import best_value

Extract = Literal["text", "answer_tag", "boxed", "last_number", "last_line"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (nested braces allowed), None if there is none or it is unclosed."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def tag_contents(text: str, tag: str = "answer") -> list[str]:
    """Contents of the `<tag>...</tag>` blocks, left to right (what `re.findall(r"<tag>(.*?)</tag>")` finds),
    in one linear pass: that regex is quadratic in the length of a reply full of unclosed `<tag>`s."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    contents, position = [], 0
    while (start := text.find(opening, position)) != -1:
        end = text.find(closing, start + len(opening))
        if end == -1:
            break
        contents.append(text[start + len(opening) : end])
        position = end + len(closing)
    return contents


def last_tag(text: str, tag: str = "answer") -> str | None:
    """Content of the last `<tag>...</tag>`, None if there is none."""
    matches = tag_contents(text, tag)
    return matches[-1] if matches else None


def extract_answer(text: str, how: Extract) -> str | None:
    """The part of a reply that holds the answer; None when the reply has no such part."""
    if how == "text":
        return text.strip()
    if how == "answer_tag":
        found = last_tag(text)
        return found.strip() if found is not None else None
    if how == "boxed":
        found = last_boxed(text)
        return found.strip() if found is not None else None
    if how == "last_number":
        numbers = _NUMBER.findall(text.replace(",", ""))
        return numbers[-1] if numbers else None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


@best_value(1.0)
def exact_match(
    rollout: Rollout,
    example: dict[str, Any],
    *,
    answer_key: str = "answer",
    extract: Extract = "text",
    case_sensitive: bool = False,
) -> float:
    """1 when the extracted answer equals `example[answer_key]` (whitespace-trimmed), else 0."""
    answer = extract_answer(rollout.last_assistant_text(), extract)
    if answer is None:
        return 0.0
    reference = str(example[answer_key]).strip()
    if not case_sensitive:
        answer, reference = answer.lower(), reference.lower()
    return float(answer == reference)


@best_value(1.0)
def numeric_match(
    rollout: Rollout,
    example: dict[str, Any],
    *,
    answer_key: str = "answer",
    extract: Extract = "last_number",
    tolerance: float = 1e-6,
    relative: bool = False,
) -> float:
    """1 when the extracted number is within `tolerance` of `example[answer_key]` (relative: of its magnitude)."""
    answer = extract_answer(rollout.last_assistant_text(), extract)
    try:
        value = float(answer.replace(",", "")) if answer is not None else None
    except ValueError:
        return 0.0
    if value is None:
        return 0.0
    reference = float(example[answer_key])
    allowed = tolerance * abs(reference) if relative else tolerance
    return float(abs(value - reference) <= allowed)


@best_value(1.0)
def math_verify(
    rollout: Rollout, example: dict[str, Any], *, answer_key: str = "answer", numeric_fallback: bool = True
) -> float:
    r"""1 when `math-verify` finds the reply's final answer (`\boxed{}` first, else the last expression)
    mathematically equal to the reference (`1/2` = `0.5` = `\frac{1}{2}`), else 0.

    `numeric_fallback` (a GSM8K reward, as in AReaL's multi-turn math example): where math-verify does not confirm the answer (it parsed nothing,
    or read `\boxed{72 clips}` as a product of symbols), the reply's number is compared with the reference's:
    see `numbers_equal`. math-verify's own signal-based timeouts are off (they only work on a main thread, and a
    big-int operation does not see the signal until it ends): the rubric runs this in a worker process and kills it
    at `timeout_s`.
    """
    reply, reference = rollout.last_assistant_text(), str(example[answer_key])
    if verified_equal(reply, reference):
        return 1.0
    return float(numeric_fallback and numbers_equal(reply, reference))


def verified_equal(reply: str, reference: str) -> bool:
    """Whether math-verify parses both and finds the reply's final answer equal to the reference."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold = parse(reference if "$" in reference or "\\boxed" in reference else f"${reference}$", parsing_timeout=None)
    answer = parse(reply, parsing_timeout=None)
    return bool(gold and answer and verify(gold, answer, timeout_seconds=None))


def numbers_equal(reply: str, reference: str, tolerance: float = 1e-6) -> bool:
    r"""The numeric fallback: the reply's answer (its last `\boxed{}`, else the whole reply) holds exactly one number,
    within `tolerance` of the reference, which is one number (GSM8K's worked solution: the number after its last
    `####`). Commas are thousands separators. False otherwise: `\boxed{3/72}` is not 72, and `1/2` is no number."""
    boxed = last_boxed(reply)
    found = _NUMBER.findall((boxed if boxed is not None else reply).replace(",", ""))
    gold = reference.rpartition("####")[2].replace(",", "").strip()
    if len(found) != 1 or _NUMBER.fullmatch(gold) is None:
        return False
    return abs(float(found[0]) - float(gold)) <= tolerance


@best_value(1.0)
def answer_tag_format(rollout: Rollout, example: dict[str, Any], *, tag: str = "answer") -> float:
    """1 when the reply has exactly one non-empty `<tag>...</tag>` block, else 0."""
    matches = tag_contents(rollout.last_assistant_text(), tag)
    return float(len(matches) == 1 and bool(matches[0].strip()))


@best_value(1.0)
def boxed_format(rollout: Rollout, example: dict[str, Any]) -> float:
    r"""1 when the reply has a closed, non-empty `\boxed{...}`, else 0."""
    found = last_boxed(rollout.last_assistant_text())
    return float(found is not None and bool(found.strip()))


@best_value(0.0)
def length_penalty(rollout: Rollout, example: dict[str, Any], *, target_tokens: int, max_tokens: int) -> float:
    """0 up to `target_tokens` sampled tokens (all turns), falling linearly to -1 at `max_tokens` and beyond.

    Negative by design: give it a positive weight and it lowers the total of long replies.
    """
    if max_tokens <= target_tokens:
        raise ValueError(f"max_tokens ({max_tokens}) must exceed target_tokens ({target_tokens})")
    excess = rollout.num_completion_tokens - target_tokens
    return -min(1.0, max(0.0, excess / (max_tokens - target_tokens)))


def env_reward(rollout: Rollout, example: dict[str, Any]) -> float:
    """Sum of the per-turn rewards the environment set (`StepOutput.reward`); turns without one count 0."""
    return sum(turn.reward or 0.0 for turn in rollout.turns)


@best_value(1.0)
def diversity_bonus(rollouts: list[Rollout], example: dict[str, Any]) -> list[float]:
    """Group function: per rollout, the share of the other rollouts whose reply text differs from its own."""
    texts = [rollout.last_assistant_text().strip() for rollout in rollouts]
    if len(texts) < 2:
        return [0.0] * len(texts)
    return [sum(other != text for other in texts) / (len(texts) - 1) for text in texts]
