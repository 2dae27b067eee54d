"""The OpenAI wire format of the gateway: requests checked and turned into renderer messages, errors as OpenAI's
error body, assistant messages back into OpenAI tool calls."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from env_types.messages import message_text
from rollouts.types import Message

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


def unsupported(body: dict[str, Any], allowed: frozenset[str]) -> None:
    """Refuse fields the gateway would otherwise silently not honor (`stop`, `n` > 1, `response_format`, ...)."""
    for key, value in body.items():
        if key in allowed or key in IGNORED_FIELDS or value in (None, False, [], {}):
            continue
        if key == "n" and value == 1:
            continue
        raise GatewayError(400, f"{key!r} is not supported by the rlmesh gateway", param=key, code="unsupported")


def include_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed answer ends with a usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise GatewayError(
            400, "'stream_options' must be an object like {\"include_usage\": true}", param="stream_options"
        )
    return options.get("include_usage", False)


def positive_int(body: dict[str, Any], key: str) -> int | None:
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


def same_message(sent: Message, returned: Message) -> bool:
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
