"""A black-box agent for the agent-task tests: it knows only an OpenAI client, makes two chat turns (after one
malformed request, whose error it expects) and computes its own reward."""

import openai


def sum_rows(split: str) -> list[dict]:
    """Rows `{a, b}`: 12 for training, 2 held out."""
    pairs = [(a, b) for a in range(1, 5) for b in range(3, 6)]
    return [{"a": a, "b": b} for a, b in (pairs[:12] if split == "train" else pairs[12:] + pairs[:2])]


async def two_turn_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    try:
        await client.chat.completions.create(model="policy", messages=[])
    except openai.BadRequestError:
        pass  # the gateway refuses it with an OpenAI-style error; the rollout goes on
    else:
        return None
    messages = [{"role": "user", "content": f"What is {row['a']} + {row['b']}?"}]
    first = await client.chat.completions.create(model="policy", messages=messages)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Check it and answer again."},
    ]
    second = await client.chat.completions.create(model="policy", messages=messages, logprobs=True)
    # the agent's own reward: shorter second answers are better (varies between samples, so groups train)
    return 1.0 / (1 + len(second.choices[0].logprobs.content))


async def failing_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    """Gives up (its own error): returns None."""
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    return None


async def raising_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    raise RuntimeError(f"agent crashed on row {row['a']}")


async def slow_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    import asyncio

    await asyncio.sleep(30)
    return 1.0


async def nan_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    return float("nan")


def sync_agent(client: openai.AsyncOpenAI, row: dict) -> float | None:
    return 1.0
