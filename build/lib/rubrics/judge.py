"""A judge reward function: a frozen model grades each rollout.

The judge fills a prompt template with the rollout and its row, renders it with the judge
model's renderer, and asks the model through a `GenerateFn` -- the same batch call
(`list[GenerationRequest] -> list[Completion | error text]`) the policy's generators serve, so
a frozen model's generator plugs in unchanged. Requests of concurrent rollouts are gathered
for up to `batch_window_s` (or `max_batch` requests) and sent as one call; each call has a
deadline of `timeout_s`. The reply is turned into a number by a parser: "yes_no" (1/0),
"score_0_10" (n/10), or any `text -> float` function. A judge that fails, times out or gives
an unreadable verdict raises, so the rubric marks that rollout as an error (left out of
training) instead of blaming the policy.

From config: `{ fn = "judge", args = { model = "grader", template = "..." } }` grades with the
frozen model `grader` once it is connected with `connect_model` (the RewardActor's job).
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Awaitable, Callable
from typing import Any

from env_types.renderer import parse_completion, render_prompt
from rl.components import import_object
from rollouts.types import Completion, GenerationFailed, GenerationRequest, Rollout

GenerateFn = Callable[[list[GenerationRequest]], Awaitable[list["Completion | GenerationFailed"]]]
"""A generator's batch call: one completion per request, or a `GenerationFailed` for a request that failed."""

DEFAULT_TEMPLATE = (
    "You grade answers. Question:\n{prompt}\n\nReference answer: {answer}\n\nAnswer to grade:\n{response}\n\n"
    "Is the answer to grade correct? Reply with just yes or no."
)


class JudgeError(Exception):
    """The judge model could not give a verdict (failed call, deadline, unreadable reply)."""


def parse_yes_no(text: str) -> float:
    """1 for a reply starting with "yes", 0 for "no" (case and punctuation ignored)."""
    words = re.findall(r"[a-z]+", text.lower())
    if words and words[0] in ("yes", "no"):
        return float(words[0] == "yes")
    raise JudgeError(f"judge reply has no yes/no verdict: {text[:200]!r}")


def parse_score_0_10(text: str) -> float:
    """The last integer 0..10 of the reply, divided by 10."""
    scores = [int(n) for n in re.findall(r"\b(\d+)\b", text) if 0 <= int(n) <= 10]
    if not scores:
        raise JudgeError(f"judge reply has no score from 0 to 10: {text[:200]!r}")
    return scores[-1] / 10


PARSERS: dict[str, Callable[[str], float]] = {"yes_no": parse_yes_no, "score_0_10": parse_score_0_10}


def template_fields(rollout: Rollout, example: dict[str, Any]) -> dict[str, Any]:
    """What a template may use: every row field, `prompt` (the first user message) and `response` (the last reply)."""
    prompt = ""
    if rollout.turns:
        users = [m for m in rollout.turns[0].prompt_messages if m.get("role") == "user"]
        prompt = (users[0].get("content") or "") if users else ""
    return {**example, "prompt": prompt, "response": rollout.last_assistant_text()}


class Judge:
    """An async reward function `(rollout, example) -> float` backed by a frozen model."""

    def __init__(
        self,
        generate: GenerateFn,
        renderer: Any,
        *,
        template: str = DEFAULT_TEMPLATE,
        parser: str | Callable[[str], float] = "yes_no",
        system_prompt: str | None = None,
        max_new_tokens: int = 32,
        max_batch: int = 64,
        batch_window_s: float = 0.05,
        timeout_s: float = 60.0,
    ):
        self.generate, self.renderer = generate, renderer
        self.template, self.system_prompt = template, system_prompt
        self.parser = (PARSERS.get(parser) or import_object(parser)) if isinstance(parser, str) else parser
        self.max_new_tokens, self.max_batch = max_new_tokens, max_batch
        self.batch_window_s, self.timeout_s = batch_window_s, timeout_s
        self._pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task] = set()
        self.__name__ = "judge"

    def messages(self, rollout: Rollout, example: dict[str, Any]) -> list[dict[str, str]]:
        """The judge's conversation for one rollout."""
        content = string.Formatter().vformat(self.template, (), template_fields(rollout, example))
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": content}]

    async def __call__(self, rollout: Rollout, example: dict[str, Any]) -> float:
        prompt_ids = render_prompt(self.renderer, self.messages(rollout, example))
        completion = await self._submit(
            GenerationRequest(prompt_token_ids=prompt_ids, max_new_tokens=self.max_new_tokens)
        )
        reply = parse_completion(self.renderer, completion.token_ids, prompt_ids=prompt_ids)
        return self.parser(reply.get("content") or "")

    async def _submit(self, request: GenerationRequest) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.batch_window_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.ensure_future(self._send(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[GenerationRequest, asyncio.Future]]) -> None:
        try:
            results = await asyncio.wait_for(self.generate([request for request, _ in batch]), self.timeout_s)
        except TimeoutError:
            results = [GenerationFailed(f"judge call took longer than {self.timeout_s:g} s")] * len(batch)
        except Exception as exc:
            results = [GenerationFailed(f"judge call failed: {exc!r}")] * len(batch)
        for (_, future), result in zip(batch, results):
            if future.done():
                continue
            if isinstance(result, GenerationFailed):
                future.set_exception(JudgeError(str(result)))
            else:
                future.set_result(result)


_MODELS: dict[str, tuple[GenerateFn, Any]] = {}
_JUDGES: dict[tuple, Judge] = {}


def connect_frozen_models(gateway: Any, renderers: dict[str, Any], sampling: Any) -> None:
    """Connect the frozen models named in `renderers` for judging. Requests go through the controller's
    `ServiceGateway` (which serves each model's service under the model's name): its router, failover and deadlines."""
    for name, renderer in renderers.items():

        async def generate(requests: list[GenerationRequest], model: str = name) -> list:
            return await gateway.call.call_one(model, "generate", requests, sampling)

        connect_model(name, generate, renderer)


def connect_model(name: str, generate: GenerateFn, renderer: Any) -> None:
    """Make the frozen model `name` available to `judge` reward functions in this process."""
    _MODELS[name] = (generate, renderer)
    for key in [key for key in _JUDGES if key[0] == name]:
        del _JUDGES[key]


async def judge(
    rollout: Rollout,
    example: dict[str, Any],
    *,
    model: str,
    template: str = DEFAULT_TEMPLATE,
    parser: str = "yes_no",
    system_prompt: str | None = None,
    max_new_tokens: int = 32,
    max_batch: int = 64,
    batch_window_s: float = 0.05,
    timeout_s: float = 60.0,
) -> float:
    """The config-facing judge: grades with the connected frozen model `model` (one `Judge` per settings)."""
    if parser not in PARSERS and ":" not in parser:
        raise ValueError(f"unknown judge parser {parser!r}; use one of {sorted(PARSERS)} or an import path pkg.mod:fn")
    key = (model, template, parser, system_prompt, max_new_tokens, max_batch, batch_window_s, timeout_s)
    if key not in _JUDGES:
        if model not in _MODELS:
            raise JudgeError(f"no frozen model {model!r} is connected for judging (declare it under [models.{model}])")
        generate, renderer = _MODELS[model]
        _JUDGES[key] = Judge(
            generate,
            renderer,
            template=template,
            parser=parser,
            system_prompt=system_prompt,
            max_new_tokens=max_new_tokens,
            max_batch=max_batch,
            batch_window_s=batch_window_s,
            timeout_s=timeout_s,
        )
    return await _JUDGES[key](rollout, example)
