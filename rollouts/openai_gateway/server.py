"""The gateway's HTTP server (aiohttp, loopback unless told otherwise): `/rollouts/<key>/v1/...` routed to that
rollout's `AgentSession`, answers as JSON or as server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from rollouts.openai_gateway.parsing import GatewayError, include_usage
from rollouts.openai_gateway.session import AgentSession
from rollouts.renderer_env import RendererEnvConfig
from rollouts.types import Completion, GenerationRequest, Rollout


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


MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body the server reads; a larger one is answered 413."""


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
            app = web.Application(client_max_size=MAX_BODY_BYTES)
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
            except web.HTTPRequestEntityTooLarge:
                raise GatewayError(
                    413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large"
                ) from None
            except ValueError:
                raise GatewayError(400, "the request body is not valid JSON") from None
            except RecursionError:
                raise GatewayError(400, "the request body's JSON is nested too deeply") from None
            if not isinstance(body, dict):
                raise GatewayError(400, "the request body must be a JSON object")
            usage = include_usage(body)
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
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await stream.prepare(request)
        for event in stream_events(response, usage):
            await stream.write(event.encode())
        await stream.write_eof()
        return stream
