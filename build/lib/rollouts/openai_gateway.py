"""An OpenAI-compatible HTTP endpoint over the policy's generators, recording every call of a rollout token-exact.

    agent ──HTTP /v1/chat/completions, /v1/completions──▶ OpenAIGateway ──▶ AgentSession (one per rollout)
                                                                             │ render (the task's renderer)
                                                                             ▼
                                                       generate (the rollout's generator replica) ──▶ RolloutTurn

An agent written against the OpenAI API trains as it is: each rollout gets its own base URL
(`http://HOST:PORT/rollouts/<key>/v1`, the key also its API key), so every call is attributed to
the rollout that made it and no rollout can reach another's session. Each call becomes one
`RolloutTurn` with the exact prompt token ids the renderer produced, the sampled token ids, their
logprobs and the policy version that sampled them.

Turns join into training samples by tokens (`rl.algorithms.streams.rollout_to_samples`). A chat call
whose history is the previous call's history plus the assistant message the gateway returned plus new
non-assistant messages is rendered by bridging (`env_types.renderer.next_turn_prompt`): its prompt extends
the previous prompt + sampled completion, so the conversation is one sample. Any other call (the agent
rewrote, dropped or re-ordered its history) is rendered afresh; when its prompt does not extend the
previous call's tokens it starts a new sample, counted in the rollout's metadata (`gateway_new_samples`)
and in the step's `rollouts/gateway_new_samples`. A completions call whose prompt text extends the
previous prompt + completion text reuses their tokens the same way.

Sampling is the run's (`generator.sampling`; validation: `generator.eval_sampling`), whatever the request's
`temperature`, `top_p` or `seed`: the samples must be the policy's. Calls are bounded by the task's
limits (`[tasks.env]`: prompt, new and total tokens, `max_turns` calls) and `call_timeout_s`; a bad or
unsupported request gets an OpenAI-style error (`{"error": {"message", "type", "param", "code"}}`) and
the rollout goes on. A rollout's calls run one at a time, in arrival order. Streaming (`stream=true`)
answers in the server-sent-event format once the completion is sampled (the generator returns whole
completions). The server listens on loopback unless given another host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from env_types.messages import message_text
from env_types.renderer import next_turn_prompt, parse_completion, render_prompt, stop_token_ids
from rollouts.renderer_env import RendererEnvConfig, sampling_seed
from rollouts.types import Completion, GenerationRequest, Message, Rollout, RolloutTurn

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
IGNORED_FIELDS = frozenset(
    {
        "model",
        "temperature",
        "top_p",
        "seed",
        "user",
        "metadata",
        "store",
        "presence_penalty",
        "frequency_penalty",
        "parallel_tool_calls",
        "stream_options",
        "service_tier",
        "reasoning_effort",
    }
)
"""Request fields accepted and not acted on: sampling is the run's, bookkeeping fields mean nothing here."""


class GatewayError(Exception):
    """A call refused or failed, answered as an OpenAI-style error with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _unsupported(body: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse fields the gateway would otherwise silently not honor (`stop`, `n` > 1, `response_format`, ...)."""
    for key, value in body.items():
        if key in allowed or key in IGNORED_FIELDS or value in (None, False, [], {}):
            continue
        if key == "n" and value == 1:
            continue
        raise GatewayError(400, f"{key!r} is not supported by the rlmesh gateway", param=key, code="unsupported")


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GatewayError(400, f"{key!r} must be a positive integer, got {value!r}", param=key)
    return value


def _text_content(content: Any, where: str) -> str | None:
    """A message's content as text: a string, a list of text parts, or None."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str) for part in content
    ):
        return "".join(part["text"] for part in content)
    raise GatewayError(400, f"{where}: content must be a string or a list of text parts", param=where)


def _arguments(raw: Any) -> Any:
    """Tool-call arguments as the renderer takes them (a dict); OpenAI clients send a JSON string."""
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):
            return json.loads(raw)
    return raw


def parse_messages(raw: Any) -> list[Message]:
    """The request's messages as renderer messages (text content, tool-call arguments decoded), or a GatewayError."""
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "'messages' must be a non-empty list", param="messages")
    messages: list[Message] = []
    for index, item in enumerate(raw):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise GatewayError(400, f"{where} must be an object", param=where)
        role = item.get("role")
        if role not in CHAT_ROLES:
            raise GatewayError(400, f"{where}: role must be one of {list(CHAT_ROLES)}, got {role!r}", param=where)
        content = _text_content(item.get("content"), where)
        message: Message = {"role": "system" if role == "developer" else role, "content": content or ""}
        if role == "assistant" and item.get("tool_calls"):
            calls = item["tool_calls"]
            if not isinstance(calls, list) or not all(
                isinstance(call, dict) and isinstance(call.get("function"), dict) for call in calls
            ):
                raise GatewayError(400, f"{where}: malformed tool_calls", param=where)
            message["tool_calls"] = [
                {
                    "type": "function",
                    **({"id": call["id"]} if call.get("id") else {}),
                    "function": {
                        "name": call["function"].get("name"),
                        "arguments": _arguments(call["function"].get("arguments")),
                    },
                }
                for call in calls
            ]
        elif content is None:
            raise GatewayError(400, f"{where}: content is required", param=where)
        for key in ("name", "tool_call_id"):
            if isinstance(item.get(key), str):
                message[key] = item[key]
        messages.append(message)
    return messages


def _same_message(sent: Message, returned: Message) -> bool:
    """Whether the agent's copy of a message is the one the gateway saw or returned (content and tool calls)."""

    def key(message: Message) -> tuple[Any, ...]:
        calls = [
            (call["function"]["name"], json.dumps(call["function"].get("arguments"), sort_keys=True))
            for call in message.get("tool_calls", [])
        ]
        return message["role"], message_text(message).strip(), calls, message.get("tool_call_id")

    return key(sent) == key(returned)


def openai_tool_calls(message: Message) -> list[dict[str, Any]]:
    """The parsed tool calls of an assistant message in the OpenAI format (arguments as a JSON string)."""
    return [
        {
            "id": call.get("id") or f"call_{index}",
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": json.dumps(call["function"]["arguments"])
                if not isinstance(call["function"]["arguments"], str)
                else call["function"]["arguments"],
            },
        }
        for index, call in enumerate(message.get("tool_calls", []))
    ]


@dataclass
class _Previous:
    """What the next call of a session may continue from."""

    messages: list[Message] = field(default_factory=list)
    """The chat history of the previous call, with the assistant message it returned."""
    tools: Any = None
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    prompt_text: str | None = None
    """The completions call's prompt and completion text (None after a chat call)."""


class AgentSession:
    """One rollout's calls: rendered, bounded, generated and appended to its `Rollout` as turns."""

    def __init__(
        self,
        key: str,
        rollout: Rollout,
        renderer: Any,
        limits: RendererEnvConfig,
        generate: Callable[[GenerationRequest], Awaitable[Completion]],
        *,
        call_timeout_s: float,
        run_seed: int | None = None,
    ):
        self.key, self.rollout, self.renderer, self.limits = key, rollout, renderer, limits
        self.generate, self.call_timeout_s, self.run_seed = generate, call_timeout_s, run_seed
        self.tokenizer = renderer._tokenizer  # where the renderers package's renderers keep it
        self.stops = set(stop_token_ids(renderer))
        self.new_samples = 0
        """Calls whose prompt did not extend the previous call's tokens: each starts a new training sample."""
        self.hit_limit = False
        """A call ran into a token or call limit (generation cut at the budget, or refused)."""
        self.closed = False
        self._previous = _Previous()
        self._lock = asyncio.Lock()

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A `/v1/chat/completions` call: its response body (stream or not, the caller formats it)."""
        _unsupported(
            body,
            frozenset({"messages", "tools", "tool_choice", "max_tokens", "max_completion_tokens", "stream"})
            | {"logprobs", "top_logprobs"},
        )
        if body.get("top_logprobs"):
            raise GatewayError(400, "'top_logprobs' is not supported", param="top_logprobs", code="unsupported")
        if body.get("tool_choice") not in (None, "auto"):
            raise GatewayError(400, "only tool_choice 'auto' is supported", param="tool_choice", code="unsupported")
        messages = parse_messages(body.get("messages"))
        tools = body.get("tools") or None
        if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
            raise GatewayError(400, "'tools' must be a list of objects", param="tools")
        max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
        async with self._lock:
            prompt_ids, new_messages = self._chat_prompt(messages, tools)
            turn = await self._call(prompt_ids, max_tokens, messages)
            assistant = parse_completion(self.renderer, turn.completion_token_ids, prompt_ids=prompt_ids, tools=tools)
            turn.assistant_message = assistant
            if new_messages is not None and len(self.rollout.turns) > 1:
                self.rollout.turns[-2].env_messages = new_messages
            self._previous = _Previous([*messages, assistant], tools, prompt_ids, turn.completion_token_ids)
        calls = openai_tool_calls(assistant)
        message: dict[str, Any] = {"role": "assistant", "content": assistant.get("content") or ""}
        if assistant.get("reasoning_content") is not None:
            message["reasoning_content"] = assistant["reasoning_content"]
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls and turn.finish_reason == "stop" else turn.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": self._token_logprobs(turn)}
        return self._response("chat.completion", body, choice, turn)

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """A `/v1/completions` call: a text or token-id prompt, completed as is (no chat template)."""
        _unsupported(body, frozenset({"prompt", "max_tokens", "stream", "logprobs"}))
        if body.get("logprobs") not in (None, 0, 1, True):
            raise GatewayError(400, "only 'logprobs' 0 or 1 (no alternatives)", param="logprobs", code="unsupported")
        max_tokens = _positive_int(body, "max_tokens")
        prompt = body.get("prompt")
        async with self._lock:
            if isinstance(prompt, str) and prompt:
                prompt_ids, prompt_text = self._text_prompt(prompt), prompt
            elif isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
                if max(prompt) >= len(self.tokenizer):
                    raise GatewayError(400, f"token id {max(prompt)} is outside the vocabulary", param="prompt")
                prompt_ids, prompt_text = list(prompt), None
            else:
                raise GatewayError(400, "'prompt' must be a non-empty string or list of token ids", param="prompt")
            turn = await self._call(prompt_ids, max_tokens, [])
            text = self.tokenizer.decode(self._without_stop(turn.completion_token_ids), skip_special_tokens=False)
            turn.assistant_message = {"role": "assistant", "content": text}
            previous_text = None if prompt_text is None else prompt_text + text
            self._previous = _Previous([], None, prompt_ids, turn.completion_token_ids, previous_text)
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": turn.finish_reason, "logprobs": None}
        if body.get("logprobs"):
            tokens = [self.tokenizer.decode([token]) for token in turn.completion_token_ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": list(turn.completion_logprobs),
                "top_logprobs": None,
                "text_offset": [sum(map(len, tokens[:i])) for i in range(len(tokens))],
            }
        return self._response("text_completion", body, choice, turn)

    def _chat_prompt(self, messages: list[Message], tools: Any) -> tuple[list[int], list[Message] | None]:
        """The call's prompt ids, bridged from the previous call when the history continues it; with the new
        messages it added (None when it does not continue)."""
        previous = self._previous
        count = len(previous.messages)
        continues = (
            count > 0
            and previous.prompt_text is None
            and tools == previous.tools
            and len(messages) > count
            and all(_same_message(a, b) for a, b in zip(messages[:count], previous.messages))
            and all(message["role"] != "assistant" for message in messages[count:])
        )
        try:
            if not continues:
                return render_prompt(self.renderer, messages, tools=tools), None
            new_messages = messages[count:]
            prompt_ids = next_turn_prompt(
                self.renderer,
                previous.messages,
                previous.prompt_ids,
                previous.completion_ids,
                new_messages,
                tools=tools,
            )
        except Exception as exc:  # the messages or tools are not something the chat template can render
            raise GatewayError(400, f"the chat template could not render this request: {exc!r}"[:2000]) from exc
        return prompt_ids, new_messages

    def _text_prompt(self, prompt: str) -> list[int]:
        """A completions prompt's ids: the previous call's ids and the new text's where the text extends it."""
        previous = self._previous
        if previous.prompt_text is not None and prompt.startswith(previous.prompt_text):
            known = previous.prompt_ids + self._without_stop(previous.completion_ids)
            rest = prompt[len(previous.prompt_text) :]
            return known + (self.tokenizer.encode(rest, add_special_tokens=False) if rest else [])
        return self.tokenizer.encode(prompt)

    def _without_stop(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] in self.stops else ids

    async def _call(self, prompt_ids: list[int], max_tokens: int | None, messages: list[Message]) -> RolloutTurn:
        """Check the limits, generate, and record the call as the rollout's next turn."""
        if self.closed:
            raise GatewayError(404, "this rollout has finished", code="rollout_finished")
        limits, turns = self.limits, self.rollout.turns
        if len(turns) >= limits.max_turns:
            self.hit_limit = True
            raise GatewayError(
                400, f"this rollout may make at most {limits.max_turns} calls (tasks.env.max_turns)", code="max_turns"
            )
        budget = min(
            limits.max_new_tokens, limits.max_total_tokens - len(prompt_ids), max_tokens or limits.max_new_tokens
        )
        if len(prompt_ids) > limits.max_prompt_tokens or budget <= 0:
            self.hit_limit = True
            raise GatewayError(
                400,
                f"the prompt has {len(prompt_ids)} tokens; this task allows {limits.max_prompt_tokens} prompt tokens "
                f"and {limits.max_total_tokens} in all (tasks.env)",
                param="messages",
                code="context_length_exceeded",
            )
        seed = None if self.run_seed is None else sampling_seed(self.run_seed, self.rollout.rollout_id, len(turns))
        request = GenerationRequest(prompt_token_ids=list(prompt_ids), max_new_tokens=budget, seed=seed)
        try:
            completion = await asyncio.wait_for(self.generate(request), self.call_timeout_s)
        except TimeoutError:
            raise GatewayError(
                504, f"generation took longer than {self.call_timeout_s} s", type="timeout", code="timeout"
            ) from None
        except Exception as exc:
            raise GatewayError(500, f"generation failed: {exc!r}", type="server_error") from exc
        if self.closed:  # the agent's time ran out while this call generated: the rollout is already recorded
            raise GatewayError(404, "this rollout has finished", code="rollout_finished")
        previous = self._previous.prompt_ids + self._previous.completion_ids
        if turns and prompt_ids[: len(previous)] != previous:
            self.new_samples += 1
            self.rollout.metadata["gateway_new_samples"] = self.new_samples
        if completion.finish_reason == "length":
            self.hit_limit = True
        turn = RolloutTurn(
            prompt_messages=messages,
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=list(completion.token_ids),
            completion_logprobs=list(completion.logprobs),
            finish_reason=completion.finish_reason,
            policy_version=completion.policy_version,
        )
        turns.append(turn)
        return turn

    def _token_logprobs(self, turn: RolloutTurn) -> list[dict[str, Any]]:
        entries = []
        for token, logprob in zip(turn.completion_token_ids, turn.completion_logprobs):
            text = self.tokenizer.decode([token])
            entries.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
        return entries

    def _response(self, kind: str, body: dict[str, Any], choice: dict[str, Any], turn: RolloutTurn) -> dict[str, Any]:
        prompt_tokens, completion_tokens = len(turn.prompt_token_ids), len(turn.completion_token_ids)
        return {
            "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{secrets.token_hex(8)}",
            "object": kind,
            "created": int(time.time()),
            "model": body.get("model") or "policy",
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def stream_events(response: dict[str, Any], include_usage: bool) -> list[str]:
    """A finished response as the server-sent events of a streamed one (`data: {...}` lines, then `[DONE]`)."""
    chunk = {key: response[key] for key in ("id", "created", "model")}
    [choice] = response["choices"]
    events: list[dict[str, Any]] = []
    if response["object"] == "chat.completion":
        chunk["object"] = "chat.completion.chunk"
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if "reasoning_content" in message:
            delta["reasoning_content"] = message["reasoning_content"]
        if "tool_calls" in message:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        events.append({**chunk, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"]}]})
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    else:
        chunk["object"] = "text_completion"
        events.append({**chunk, "choices": [{**choice, "finish_reason": None}]})
        events.append({**chunk, "choices": [{"index": 0, "text": "", "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        events.append({**chunk, "choices": [], "usage": response["usage"]})
    return [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]


class OpenAIGateway:
    """The HTTP server: routes `/rollouts/<key>/v1/...` to that rollout's session; unknown keys get a 404."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.host, self.port, self._bind_port = host, port, port
        self.sessions: dict[str, AgentSession] = {}
        self._runner: Any = None
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        """Listen (once; later calls return at once). Port 0 takes a free port."""
        from aiohttp import web

        async with self._start_lock:
            if self._runner is not None:
                return
            app = web.Application(client_max_size=8 * 1024 * 1024)
            app.router.add_post("/rollouts/{key}/v1/chat/completions", self._handle)
            app.router.add_post("/rollouts/{key}/v1/completions", self._handle)
            app.router.add_get("/rollouts/{key}/v1/models", self._models)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, self.host, self._bind_port)
            await site.start()
            self.port = runner.addresses[0][1]
            self._runner = runner

    async def stop(self) -> None:
        """Stop listening (a later session starts the server again); calls in flight are waited for."""
        async with self._start_lock:
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None

    @contextlib.asynccontextmanager
    async def session(
        self,
        rollout: Rollout,
        renderer: Any,
        limits: RendererEnvConfig,
        generate: Callable[[GenerationRequest], Awaitable[Completion]],
        **kwargs: Any,
    ) -> AsyncIterator[AgentSession]:
        """A session for one rollout, reachable at `base_url(session)` until the block ends (the server, started
        with the first session, keeps listening until `stop`)."""
        key = secrets.token_urlsafe(18)
        session = AgentSession(key, rollout, renderer, limits, generate, **kwargs)
        self.sessions[key] = session
        try:
            await self.start()
            yield session
        finally:
            session.closed = True
            del self.sessions[key]

    def base_url(self, session: AgentSession) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/rollouts/{session.key}/v1"

    def _session_of(self, request: Any) -> AgentSession:
        key = request.match_info["key"]
        session = self.sessions.get(key)
        if session is None:
            raise GatewayError(404, "no such rollout (finished, or never opened)", code="rollout_not_found")
        bearer = request.headers.get("Authorization")
        if bearer is not None and bearer != f"Bearer {key}":
            raise GatewayError(401, "the API key is not this rollout's", type="authentication_error")
        return session

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._session_of(request)
        except GatewayError as error:
            return web.json_response(error.body(), status=error.status)
        return web.json_response(
            {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "rlmesh"}]}
        )

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        try:
            session = self._session_of(request)
            try:
                body = await request.json()
            except ValueError:
                raise GatewayError(400, "the request body is not valid JSON") from None
            if not isinstance(body, dict):
                raise GatewayError(400, "the request body must be a JSON object")
            if request.path.endswith("/chat/completions"):
                response = await session.chat(body)
            else:
                response = await session.complete(body)
        except GatewayError as error:
            return web.json_response(error.body(), status=error.status)
        except Exception as exc:  # a bug of the gateway's: this call fails, the server and the rollout go on
            error = GatewayError(500, f"the gateway failed on this request: {exc!r}"[:2000], type="server_error")
            return web.json_response(error.body(), status=error.status)
        if not body.get("stream"):
            return web.json_response(response)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for event in stream_events(response, include_usage):
            await stream.write(event.encode())
        await stream.write_eof()
        return stream
