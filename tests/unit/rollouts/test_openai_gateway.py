"""The OpenAI-compatible gateway over real HTTP with the `openai` client and the real Qwen3 renderer: calls recorded
token-exact as turns, history continued by bridging or counted as a new sample, OpenAI-style errors, limits, streaming,
and rollouts that cannot reach each other. The generator is scripted (each reply's token ids, known logprobs)."""

import asyncio
import sys

import httpx
import openai
import pytest

from rl.algorithms.streams import rollout_to_samples
from rollouts.openai_gateway import OpenAIGateway
from rollouts.renderer_env import RendererEnvConfig
from rollouts.types import Completion, GenerationFailed, Rollout

IM_END = 151645
LIMITS = RendererEnvConfig(max_turns=4, max_new_tokens=32, max_prompt_tokens=400, max_total_tokens=512)


class ScriptedGenerator:
    """Samples each reply of `replies` in turn (its tokens + <|im_end|>), logprob -0.01 * (position + 1); records requests."""

    def __init__(self, tokenizer, replies, policy_version=3, delay_s=0.0):
        self.tokenizer, self.replies, self.policy_version, self.delay_s = (
            tokenizer,
            list(replies),
            policy_version,
            delay_s,
        )
        self.requests = []

    async def __call__(self, request):
        self.requests.append(request)
        reply = self.replies.pop(0)
        await asyncio.sleep(self.delay_s)
        if isinstance(reply, Exception):
            raise reply
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), IM_END][: request.max_new_tokens]
        finish = "stop" if ids[-1] == IM_END else "length"
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, policy_version=self.policy_version)


def new_rollout(name="row/0"):
    return Rollout(rollout_id=name, group_id=name.split("/")[0], task_name="agent", sample_index=0)


@pytest.fixture
async def gateway():
    server = OpenAIGateway()
    yield server
    await server.stop()


def client_of(gateway, session, key=None):
    return openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key=key or session.key, max_retries=0)


async def test_two_chat_turns_are_one_sample_token_exact(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["Paris.", "About 2 million."])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        assert gateway.host == "127.0.0.1"  # loopback unless configured
        client = client_of(gateway, session)
        history = [{"role": "user", "content": "Capital of France?"}]
        first = await client.chat.completions.create(model="any", messages=history, logprobs=True)
        assert first.choices[0].message.content == "Paris." and first.choices[0].finish_reason == "stop"
        assert [entry.logprob for entry in first.choices[0].logprobs.content] == pytest.approx(
            [-0.01 * (i + 1) for i in range(len(tokenizer.encode("Paris.")) + 1)]
        )
        history += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Population?"}]
        second = await client.chat.completions.create(model="any", messages=history)
        assert second.choices[0].message.content == "About 2 million."
        assert second.usage.prompt_tokens == len(generate.requests[1].prompt_token_ids)
        await client.close()
    first_turn, second_turn = rollout.turns
    expected_prompt = renderer.render_ids(history[:1], add_generation_prompt=True)
    assert first_turn.prompt_token_ids == expected_prompt == generate.requests[0].prompt_token_ids
    assert first_turn.completion_token_ids == [*tokenizer.encode("Paris.", add_special_tokens=False), IM_END]
    assert first_turn.completion_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(3)])
    assert first_turn.policy_version == second_turn.policy_version == 3
    # the second prompt extends the first prompt + its sampled completion, token for token
    sampled = first_turn.prompt_token_ids + first_turn.completion_token_ids
    assert second_turn.prompt_token_ids[: len(sampled)] == sampled
    assert tokenizer.decode(second_turn.prompt_token_ids[len(sampled) :]).strip().startswith("<|im_start|>user")
    assert first_turn.env_messages == [{"role": "user", "content": "Population?"}]
    assert second_turn.prompt_messages[-1] == {"role": "user", "content": "Population?"}
    [sample] = rollout_to_samples(rollout, 1.0)
    assert sample.input_ids == second_turn.prompt_token_ids + second_turn.completion_token_ids
    assert sum(sample.loss_mask) == len(first_turn.completion_token_ids) + len(second_turn.completion_token_ids)
    assert "gateway_new_samples" not in rollout.metadata


async def test_a_rewritten_history_starts_a_new_sample_and_is_counted(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["Paris.", "Lyon.", "Yes."])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        client = client_of(gateway, session)
        question = {"role": "user", "content": "Capital of France?"}
        await client.chat.completions.create(model="m", messages=[question])
        # the agent edits the assistant's answer before going on: not what was sampled
        edited = [question, {"role": "assistant", "content": "Paris, France."}, {"role": "user", "content": "And?"}]
        await client.chat.completions.create(model="m", messages=edited)
        assert session.new_samples == 1 and rollout.metadata["gateway_new_samples"] == 1
        # a history that continues the (new) previous call bridges again: not counted
        edited += [{"role": "assistant", "content": "Lyon."}, {"role": "user", "content": "Sure?"}]
        await client.chat.completions.create(model="m", messages=edited)
        assert session.new_samples == 1
        await client.close()
    first, second, third = rollout.turns
    assert second.prompt_token_ids == renderer.render_ids(edited[:3], add_generation_prompt=True)
    samples = rollout_to_samples(rollout, 1.0)
    assert [sample.input_ids for sample in samples] == [
        first.prompt_token_ids + first.completion_token_ids,
        third.prompt_token_ids + third.completion_token_ids,
    ]


async def test_bad_requests_get_openai_errors_and_the_rollout_goes_on(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["fine", "still fine"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        client = client_of(gateway, session)
        with pytest.raises(openai.BadRequestError) as missing:
            await client.chat.completions.create(model="m", messages=[])
        assert missing.value.status_code == 400
        assert missing.value.body["type"] == "invalid_request_error" and missing.value.body["param"] == "messages"
        with pytest.raises(openai.BadRequestError, match="role must be one of"):
            await client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "hi"}])
        with pytest.raises(openai.BadRequestError, match="'stop' is not supported") as stop:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stop=["x"])
        assert stop.value.body["code"] == "unsupported"
        with pytest.raises(openai.BadRequestError, match="'n' is not supported"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=2)
        async with httpx.AsyncClient() as raw:
            url = f"{gateway.base_url(session)}/chat/completions"
            not_json = await raw.post(url, content=b"{not json", headers={"Content-Type": "application/json"})
            assert (
                not_json.status_code == 400
                and not_json.json()["error"]["message"] == "the request body is not valid JSON"
            )
        with pytest.raises(openai.BadRequestError, match="token id 999999999 is outside the vocabulary"):
            await client.completions.create(model="m", prompt=[1, 999999999])
        assert rollout.turns == [] and generate.requests == []  # nothing reached the generator
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "fine"
        await client.close()
    assert len(rollout.turns) == 1


async def test_two_rollouts_never_see_each_others_calls(gateway, renderer, tokenizer):
    first_rollout, second_rollout = new_rollout("a/0"), new_rollout("b/0")
    generate_a = ScriptedGenerator(tokenizer, [f"A{i}" for i in range(4)], delay_s=0.02)
    generate_b = ScriptedGenerator(tokenizer, [f"B{i}" for i in range(4)], delay_s=0.01)

    async def agent(session, name):
        client = client_of(gateway, session)
        replies = []
        for turn in range(3):
            messages = [{"role": "user", "content": f"{name} turn {turn}"}]
            replies.append(
                (await client.chat.completions.create(model="m", messages=messages)).choices[0].message.content
            )
        await client.close()
        return replies

    async with (
        gateway.session(first_rollout, renderer, LIMITS, generate_a, call_timeout_s=10) as a,
        gateway.session(second_rollout, renderer, LIMITS, generate_b, call_timeout_s=10) as b,
    ):
        assert gateway.base_url(a) != gateway.base_url(b) and a.key != b.key
        replies_a, replies_b = await asyncio.gather(agent(a, "a"), agent(b, "b"))
        assert replies_a == ["A0", "A1", "A2"] and replies_b == ["B0", "B1", "B2"]
        # another rollout's key on this rollout's URL is refused
        intruder = client_of(gateway, a, key=b.key)
        with pytest.raises(openai.AuthenticationError):
            await intruder.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await intruder.close()
        stale = client_of(gateway, a)
    with pytest.raises(openai.NotFoundError):  # a finished rollout's URL answers nothing
        await stale.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
    await stale.close()
    for rollout, name in ((first_rollout, "a"), (second_rollout, "b")):
        assert [turn.prompt_messages[0]["content"] for turn in rollout.turns] == [f"{name} turn {t}" for t in range(3)]


async def test_limits_bound_each_call(gateway, renderer, tokenizer):
    limits = RendererEnvConfig(max_turns=3, max_new_tokens=4, max_prompt_tokens=40, max_total_tokens=64)
    generate = ScriptedGenerator(tokenizer, ["one two three four five six", "ok", "never"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, limits, generate, call_timeout_s=10) as session:
        client = client_of(gateway, session)
        cut = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count"}])
        assert generate.requests[0].max_new_tokens == 4 and cut.choices[0].finish_reason == "length"
        assert session.hit_limit
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 60}])
        assert too_long.value.body["code"] == "context_length_exceeded"
        short = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
        assert generate.requests[1].max_new_tokens == 1 and short.usage.completion_tokens == 1
        with pytest.raises(openai.BadRequestError) as fourth:  # the refused call counted toward max_turns = 3
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        assert fourth.value.body["code"] == "max_turns"
        await client.close()
    assert len(rollout.turns) == 2


async def test_slow_and_failing_generation_answer_errors(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["late", GenerationFailed("engine rejected it"), "ok"], delay_s=0.3)
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=0.1) as session:
        client = client_of(gateway, session)
        with pytest.raises(openai.APIStatusError) as slow:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert slow.value.status_code == 504 and slow.value.body["type"] == "timeout"
        session.call_timeout_s = 5
        with pytest.raises(openai.InternalServerError, match="engine rejected it"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        ok = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert ok.choices[0].message.content == "ok"
        await client.close()
    assert [turn.completion_token_ids for turn in rollout.turns] == [[*tokenizer.encode("ok"), IM_END]]


async def test_streaming_chat_and_completions_with_text_continuation(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["Hello there", " and more", "x"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        client = client_of(gateway, session)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage.completion_tokens == len(rollout.turns[0].completion_token_ids)
        # completions: a text prompt that extends the previous prompt + completion reuses their tokens
        prompt = "The list: apples,"
        first = await client.completions.create(model="m", prompt=prompt, logprobs=1)
        assert first.choices[0].text == " and more" and first.choices[0].finish_reason == "stop"
        assert first.choices[0].logprobs.token_logprobs == pytest.approx([-0.01 * (i + 1) for i in range(3)])
        await client.completions.create(model="m", prompt=prompt + " and more, pears")
        await client.close()
    _, completion, continued = rollout.turns
    assert completion.prompt_token_ids == tokenizer.encode(prompt)
    kept = completion.prompt_token_ids + completion.completion_token_ids[:-1]  # the stop token is not in the text
    assert continued.prompt_token_ids == kept + tokenizer.encode(", pears", add_special_tokens=False)
    assert session.new_samples == 2  # the completions call after the chat; the stop token dropped from the text


async def test_an_oversized_body_gets_413_and_the_rollout_goes_on(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["fine"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        url = f"{gateway.base_url(session)}/chat/completions"
        body = b'{"messages": [{"role": "user", "content": "' + b"x" * (9 * 1024 * 1024) + b'"}]}'
        async with httpx.AsyncClient(timeout=60) as raw:
            too_big = await raw.post(url, content=body, headers={"Content-Type": "application/json"})
            assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
            nested = await raw.post(url, content=b"[" * 100_000 + b"]" * 100_000)
            assert nested.status_code == 400 and nested.json()["error"]["type"] == "invalid_request_error"
        client = client_of(gateway, session)
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "fine"
        await client.close()
    assert generate.requests and len(rollout.turns) == 1


async def test_a_malformed_stream_options_is_refused_before_the_turn(gateway, renderer, tokenizer):
    generate = ScriptedGenerator(tokenizer, ["fine"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, LIMITS, generate, call_timeout_s=10) as session:
        url = f"{gateway.base_url(session)}/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "stream_options": "usage"}
        async with httpx.AsyncClient() as raw:
            refused = await raw.post(url, json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream_options"
    assert rollout.turns == [] and generate.requests == []  # nothing generated, nothing recorded


async def test_a_huge_prompt_is_refused_before_it_is_rendered_and_counts_as_a_call(
    gateway, renderer, tokenizer, monkeypatch
):
    """Text that cannot fit `max_prompt_tokens` (no token spans more characters than the vocabulary's longest) is
    refused without rendering it; the refusal counts toward `max_turns` like a generated call."""
    limits = RendererEnvConfig(max_turns=3, max_new_tokens=4, max_prompt_tokens=40, max_total_tokens=64)
    generate = ScriptedGenerator(tokenizer, ["ok", "never"])
    rollout = new_rollout()
    async with gateway.session(rollout, renderer, limits, generate, call_timeout_s=10) as session:
        module = sys.modules[type(session).__module__]
        rendered, real_render = [], module.render_prompt

        def spy(*args, **kwargs):
            rendered.append(args[1])
            return real_render(*args, **kwargs)

        monkeypatch.setattr(module, "render_prompt", spy)
        client = client_of(gateway, session)
        huge = [{"role": "user", "content": "word " * (1 << 20)}]  # 5 MiB
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.chat.completions.create(model="m", messages=huge)
        assert too_long.value.body["code"] == "context_length_exceeded" and rendered == []
        with pytest.raises(openai.BadRequestError) as too_long_text:
            await client.completions.create(model="m", prompt="word " * (1 << 20))
        assert too_long_text.value.body["code"] == "context_length_exceeded"
        assert session.hit_limit
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert len(rendered) == 1
        with pytest.raises(openai.BadRequestError) as past:  # two refused + one generated: past max_turns = 3
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        assert past.value.body["code"] == "max_turns"
        await client.close()
    assert len(rollout.turns) == 1 and len(generate.requests) == 1
