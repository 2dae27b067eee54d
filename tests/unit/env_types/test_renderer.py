"""Rendering and parsing through `renderers` on both offline tokenizers, checked token for token."""

import pytest
from renderers import DefaultRenderer, Qwen3Renderer

from env_types.renderer import (
    build_renderer,
    load_tokenizer,
    next_turn_prompt,
    parse_completion,
    render_prompt,
    stop_token_ids,
)
from rl.assets import resolve_model_path
from rl.config import Config, ConfigError
from rl.config.tasks import RendererConfig
from rl.loop.resolve import resolve_config

CONVERSATION = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 2+3?"},
]
REPLY = "The sum is 5.\n\nAnswer: 5"
FOLLOW_UP = [{"role": "user", "content": "And 4+4?"}]
CHATML_PROMPT = (
    "<|im_start|>system\nYou are a calculator.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EXPECTED_PROMPT = {
    "smollm2-135m-instruct": CHATML_PROMPT,
    # The generation prompt prefills an empty thinking block when thinking is off.
    "tiny-qwen3": CHATML_PROMPT + "<think>\n\n</think>\n\n",
}
EXPECTED_STOP_IDS = {
    "smollm2-135m-instruct": [2],  # <|im_end|>
    "tiny-qwen3": [151643, 151645],  # <|endoftext|>, <|im_end|>
}
MODELS = list(EXPECTED_PROMPT)


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    """(name, renderer, tokenizer) with the default `RendererConfig` ("auto", no thinking)."""
    renderer = build_renderer(RendererConfig(), request.param)
    return request.param, renderer, renderer._tokenizer


@pytest.fixture(scope="module")
def qwen3():
    renderer = build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")
    return renderer, renderer._tokenizer


def emitted(tokenizer, text: str) -> list[int]:
    """Token ids a model emits for `text` followed by the end of its turn."""
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_auto_picks_the_hand_coded_qwen3_renderer_and_the_template_for_smollm2():
    assert isinstance(build_renderer(RendererConfig(), "tiny-qwen3"), Qwen3Renderer)
    assert isinstance(build_renderer(RendererConfig(), "smollm2-135m-instruct"), DefaultRenderer)


def test_a_runs_renderers_share_one_tokenizer_per_model():
    """A run with many tasks parses the tokenizer once, whether the model is named by asset or by folder."""
    first = build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")
    second = build_renderer(RendererConfig(), resolve_model_path("tiny-qwen3"))
    assert first is not second and first._tokenizer is second._tokenizer is load_tokenizer("tiny-qwen3")
    assert load_tokenizer("smollm2-135m-instruct") is not load_tokenizer("tiny-qwen3")


def test_unknown_renderer_name_is_rejected_naming_the_key():
    with pytest.raises(ConfigError, match="tasks.0.renderer.name"):
        resolve_config(Config(tasks=[{"renderer": {"name": "no-such-renderer"}}]))


def test_prompt_is_the_exact_chatml_string(model):
    name, renderer, tokenizer = model
    prompt_ids = render_prompt(renderer, CONVERSATION)
    assert tokenizer.decode(prompt_ids) == EXPECTED_PROMPT[name]
    assert prompt_ids == tokenizer.encode(EXPECTED_PROMPT[name], add_special_tokens=False)


def test_stop_token_ids(model):
    name, renderer, _ = model
    assert stop_token_ids(renderer) == EXPECTED_STOP_IDS[name]


def test_render_parse_round_trip(model):
    _, renderer, tokenizer = model
    prompt_ids = render_prompt(renderer, CONVERSATION)
    message = parse_completion(renderer, emitted(tokenizer, REPLY), prompt_ids=prompt_ids)
    assert message == {"role": "assistant", "content": REPLY}


def test_qwen3_parses_thinking_and_tool_calls():
    renderer = build_renderer(RendererConfig(enable_thinking=True), "tiny-qwen3")
    tokenizer = renderer._tokenizer
    prompt_ids = render_prompt(renderer, CONVERSATION)
    assert tokenizer.decode(prompt_ids) == CHATML_PROMPT
    completion = "<think>\nAdd the numbers.\n</think>\n\nLet me check.\n<tool_call>\n" + (
        '{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    message = parse_completion(renderer, emitted(tokenizer, completion), prompt_ids=prompt_ids)
    assert message == {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "Add the numbers.",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
    }


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_qwen3_prompt_matches_the_reference_chat_template(qwen3, tools):
    renderer, tokenizer = qwen3
    reference = tokenizer.apply_chat_template(
        CONVERSATION, tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    prompt_ids = render_prompt(renderer, CONVERSATION, tools=tools)
    assert tokenizer.decode(prompt_ids) == reference
    assert prompt_ids == tokenizer.encode(reference, add_special_tokens=False)


def test_qwen3_history_keeps_the_prefilled_empty_thinking_block(qwen3):
    """The one documented deviation from the template: past turns keep what was sampled after."""
    renderer, tokenizer = qwen3
    history = [*CONVERSATION, {"role": "assistant", "content": REPLY}, *FOLLOW_UP]
    reference = tokenizer.apply_chat_template(
        history, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    past_turn = "<|im_start|>assistant\n" + REPLY
    assert reference.count(past_turn) == 1
    expected = reference.replace(past_turn, "<|im_start|>assistant\n<think>\n\n</think>\n\n" + REPLY)
    assert tokenizer.decode(render_prompt(renderer, history)) == expected


def test_qwen3_next_turn_extends_the_sampled_tokens_verbatim(qwen3):
    renderer, tokenizer = qwen3
    prompt_ids = render_prompt(renderer, CONVERSATION)
    # "The" sampled as "Th" + "e": same text, not the tokenizer's own split.
    completion_ids = [tokenizer.convert_tokens_to_ids(t) for t in ("Th", "e")] + emitted(tokenizer, REPLY[3:])
    assert tokenizer.decode(completion_ids) == tokenizer.decode(emitted(tokenizer, REPLY))
    assert completion_ids != emitted(tokenizer, REPLY)
    message = parse_completion(renderer, completion_ids, prompt_ids=prompt_ids)
    history = [*CONVERSATION, message]

    next_ids = next_turn_prompt(renderer, history, prompt_ids, completion_ids, FOLLOW_UP)
    added = "\n<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert next_ids == prompt_ids + completion_ids + tokenizer.encode(added, add_special_tokens=False)
    # A full re-render re-tokenizes the reply and loses the sampled split.
    rerendered = render_prompt(renderer, [*history, *FOLLOW_UP])
    assert tokenizer.decode(rerendered) == tokenizer.decode(next_ids)
    assert rerendered != next_ids

    # A turn cut off by max_tokens gets the end-of-turn token synthesized.
    truncated = completion_ids[:-1]
    next_ids = next_turn_prompt(renderer, history, prompt_ids, truncated, FOLLOW_UP)
    assert next_ids[: len(prompt_ids) + len(completion_ids)] == prompt_ids + completion_ids


def test_smollm2_next_turn_re_renders_the_history():
    """The template renderer cannot bridge: the next prompt is a re-render, which extends the
    previous prompt + completion only when the reply was sampled as the tokenizer would split it."""
    renderer = build_renderer(RendererConfig(), "smollm2-135m-instruct")
    tokenizer = renderer._tokenizer
    prompt_ids = render_prompt(renderer, CONVERSATION)
    completion_ids = emitted(tokenizer, REPLY)
    history = [*CONVERSATION, parse_completion(renderer, completion_ids, prompt_ids=prompt_ids)]
    assert renderer.bridge_to_next_turn(prompt_ids, completion_ids, FOLLOW_UP) is None

    next_ids = next_turn_prompt(renderer, history, prompt_ids, completion_ids, FOLLOW_UP)
    assert tokenizer.decode(next_ids) == (
        CHATML_PROMPT + REPLY + "<|im_end|>\n<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert next_ids[: len(prompt_ids) + len(completion_ids)] == prompt_ids + completion_ids


def test_preserve_thinking_between_tool_calls_bridges_the_tool_cycle_and_re_renders_at_a_user_query(qwen3):
    # torchtitan RL's RendererConfig knob (renderers 0.1.12: thinking_retention = "tool_cycle"). Qwen3 with thinking off
    # otherwise bridges at a new user query too (retention "all").
    renderer = build_renderer(RendererConfig(name="qwen3", preserve_thinking_between_tool_calls=True), "tiny-qwen3")
    tokenizer = renderer._tokenizer
    prompt_ids = render_prompt(renderer, CONVERSATION)
    thought = "<think>\nadd them\n</think>\n\n"  # sampled reasoning, which a re-render of this history would drop
    completion_ids = [*tokenizer.encode(thought, add_special_tokens=False), *emitted(tokenizer, REPLY)]
    message = parse_completion(renderer, completion_ids, prompt_ids=prompt_ids)
    assert message["reasoning_content"].strip() == "add them"
    history = [*CONVERSATION, message]
    sampled = prompt_ids + completion_ids

    after_tool = next_turn_prompt(renderer, history, prompt_ids, completion_ids, [{"role": "tool", "content": "5"}])
    assert after_tool[: len(sampled)] == sampled  # the tool cycle keeps the reasoning, token for token
    after_user = next_turn_prompt(renderer, history, prompt_ids, completion_ids, FOLLOW_UP)
    assert after_user == render_prompt(renderer, [*history, *FOLLOW_UP]) and "add them" not in tokenizer.decode(
        after_user
    )
    default, _ = qwen3
    assert next_turn_prompt(default, history, prompt_ids, completion_ids, FOLLOW_UP)[: len(sampled)] == sampled
    with pytest.raises(ValueError, match="renderer.preserve_thinking_between_tool_calls = false"):
        build_renderer(
            RendererConfig(name="default", preserve_thinking_between_tool_calls=True), "smollm2-135m-instruct"
        )
