"""What environments and renderers exchange: chat messages, and the record of a tool call that did not run."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

Message = dict[str, Any]
"""A chat message as the `renderers` package types it (`renderers.Message`, a TypedDict)."""


def message_text(message: Message) -> str:
    """A message's text: its string content, or the text parts of a multi-part content joined."""
    content = message.get("content") or ""
    return (
        content
        if isinstance(content, str)
        else "".join(part.get("text", "") for part in content if isinstance(part, dict))
    )


class ToolCallError(BaseModel):
    """A tool call that did not run as the model asked; the model is told why in a tool message."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    kind: str
    """One of `invalid_json`, `unclosed_block`, `missing_name`, `malformed_structure` (from the
    renderer's parser), `unknown_tool`, `bad_arguments` (checked against the tool's schema),
    `tool_failed` (the tool raised, timed out or hit a sandbox limit)."""
    detail: str
    tool: str | None = None

    @property
    def is_malformed(self) -> bool:
        """The call itself was wrong (as opposed to a well-formed call whose tool failed)."""
        return self.kind != "tool_failed"
