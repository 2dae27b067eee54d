"""Tools a model can call, and the environment that checks and runs its calls.

A `Tool` is a name, a description, a JSON-schema of its arguments and the import path of the
function that implements it. `ToolEnv` answers every tool call of an assistant message with a
`tool` message: the tool's result (run in a `Sandbox`), or an error telling the model what was
wrong -- a call the renderer could not parse, an unknown tool, arguments that do not fit the
schema, a tool that failed or hit a sandbox limit. Nothing is dropped: each error is also
recorded on the turn (`RolloutTurn.tool_call_errors`), where metrics count them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from env_types.message_env import MessageEnv, StepOutput
from rollouts.types import Message, ToolCallError
from tools.sandbox import Sandbox, SandboxError, SandboxLimits

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Tool:
    """One callable tool. `parameters` is a JSON schema of type object; `fn` is `package.module:function`,
    run as `fn(**arguments)` in the sandbox and expected to return text (other values are JSON-encoded)."""

    name: str
    description: str
    fn: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def spec(self) -> dict[str, Any]:
        """The tool as chat templates expect it (OpenAI function format)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def check_arguments(self, arguments: Any) -> str | None:
        """What is wrong with `arguments` for this tool, None if they fit its schema.

        Checks what the call needs to run: an object, required keys, no unknown keys, and the
        JSON type of each value (`integer` accepts no booleans, `number` accepts integers).
        """
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {json.dumps(arguments)[:100]}"
        properties = self.parameters.get("properties", {})
        missing = [name for name in self.parameters.get("required", []) if name not in arguments]
        if missing:
            return f"missing required argument(s) {', '.join(map(repr, missing))}"
        unknown = [name for name in arguments if name not in properties]
        if unknown:
            return f"unknown argument(s) {', '.join(map(repr, unknown))}; expected {sorted(properties)}"
        for name, value in arguments.items():
            expected = properties[name].get("type")
            types = [expected] if isinstance(expected, str) else (expected or [])
            if types and not any(_is_type(value, kind) for kind in types):
                return f"argument {name!r} must be of type {expected}, got {json.dumps(value)[:100]}"
        return None


def _is_type(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES.get(kind, (object,)))


def tool_message(content: str, call: dict[str, Any] | None = None) -> Message:
    message: Message = {"role": "tool", "content": content}
    if call is not None and isinstance(call["function"]["name"], str):
        message["name"] = call["function"]["name"]
        if "id" in call:
            message["tool_call_id"] = call["id"]
    return message


class ToolEnv(MessageEnv):
    """A `MessageEnv` whose assistant turns may call `tools`.

    Subclasses write `reset` (return `ResetOutput(messages, tools=self.tool_specs())`) and
    `answer`, which handles an assistant message without tool calls (a final answer). A message
    with tool calls gets one tool message per call and the conversation goes on.
    """

    def __init__(self, tools: list[Tool], *, limits: SandboxLimits = SandboxLimits(), isolate: bool = True):
        self.tools = {tool.name: tool for tool in tools}
        self.limits = limits
        self.isolate = isolate
        self._sandbox: Sandbox | None = None

    def tool_specs(self) -> list[dict[str, Any]]:
        return [tool.spec() for tool in self.tools.values()]

    async def answer(self, assistant_message: Message) -> StepOutput:
        """The environment's reply to an assistant message that calls no tool; ends the rollout by default."""
        return StepOutput(done=True)

    async def step(self, assistant_message: Message) -> StepOutput:
        calls = assistant_message.get("tool_calls") or []
        invalid = assistant_message.get("invalid_tool_calls") or []
        if not calls and not invalid:
            return await self.answer(assistant_message)
        messages, errors = [], []
        for call in calls:
            content, error = await self.call_tool(call)
            messages.append(tool_message(content, call))
            errors.extend([error] if error is not None else [])
        for bad in invalid:
            # Parse failures are recorded on the turn by the renderer env; here the model is told.
            messages.append(
                tool_message(
                    f"Error: your tool call could not be parsed ({bad['error']}): {bad['raw'][:200]!r}. "
                    'A tool call is a JSON object {"name": <tool name>, "arguments": {...}}.'
                )
            )
        return StepOutput(messages=messages, done=False, tool_call_errors=errors)

    async def call_tool(self, call: dict[str, Any]) -> tuple[str, ToolCallError | None]:
        """The tool message text for one parsed call, and the error record if it did not run."""
        name, arguments = call["function"]["name"], call["function"].get("arguments", {})
        if not isinstance(name, str):
            detail = f"the tool name must be a string, got {json.dumps(name)[:100]}"
            return f"Error: {detail}.", ToolCallError(kind="bad_arguments", detail=detail)
        tool = self.tools.get(name)
        if tool is None:
            detail = f"unknown tool {name!r}; available tools: {', '.join(sorted(self.tools)) or 'none'}"
            return f"Error: {detail}.", ToolCallError(kind="unknown_tool", tool=name, detail=detail)
        problem = tool.check_arguments(arguments)
        if problem is not None:
            return f"Error: bad arguments for {name!r}: {problem}.", ToolCallError(
                kind="bad_arguments", tool=name, detail=problem
            )
        if self._sandbox is None:
            self._sandbox = Sandbox(self.limits, isolate=self.isolate)
        try:
            return await self._sandbox.run(tool.fn, arguments), None
        except SandboxError as exc:
            return f"Error: tool {name!r} failed: {exc}", ToolCallError(kind="tool_failed", tool=name, detail=str(exc))

    async def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
