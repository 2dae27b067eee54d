"""Attested weight sync on a real in-process vLLM (tiny Qwen3, fp32): each fault injected into a sync is detected
by measuring what vLLM holds after its own load path (`load_shared_weights` → `reload_weights`, fused qkv and
gate_up, oneDNN-packed linear layers on CPU), and a clean sync is never refused.

Each sync goes through the generator's own functions: the version's bytes in a shared file, `load_weights`, then
`attest_loaded` while the engine is paused. The trainer's side is `fingerprint_state_dict` of the tensors as
published."""

import asyncio
import functools
import os
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from actors.engine_loop import EngineLoop
from actors.generator import AttestationFailed, attest_loaded, engine_args, load_weights, reload_proven
from rl.assets import resolve_model_path
from rl.config import load_config
from rl.weights.attestation import fingerprint_state_dict
from rl.weights.shared_file import SharedWeights, file_path, map_file, plan_layout, write
from tests.support.inprocess_engine import werkzeug_proxies_hidden
from tests.support.paths import E2E_CONFIGS

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.attestation]

DEADLINE_S = 300


@pytest.fixture(scope="module")
def versions():
    """Policy versions 1 and 2: the model's weights after one and two Adam-sized steps (1e-4 per element)."""
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    first = {
        name: tensor + 1e-4 * torch.sign(torch.randn(tensor.shape, generator=generator))
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to the embedding: published once
    }
    second = {
        name: tensor + 1e-4 * torch.sign(torch.randn(tensor.shape, generator=generator))
        for name, tensor in first.items()
    }
    return {1: first, 2: second}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    generator_config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"generator.max_model_len": "128"}).generator
    with werkzeug_proxies_hidden():
        llm = LLM(model=resolve_model_path("tiny-qwen3"), **engine_args(generator_config))  # the actor's engine
    loop = EngineLoop(llm.llm_engine)
    yield llm, loop
    await loop.close()
    llm.llm_engine.engine_core.shutdown()


def publish(state_dict: dict[str, torch.Tensor], tag: str, dtype: torch.dtype | None = None) -> SharedWeights:
    """The bytes of a version in a shared file, as the trainer's publisher writes them (cast to `dtype`)."""
    layout, nbytes = plan_layout(state_dict, dtype)
    path = file_path(f"attestation-test-{tag}")
    buffer = map_file(path, nbytes, create=True)
    for name, tensor in state_dict.items():
        write(buffer, layout[name], tensor)
    return SharedWeights(path, nbytes, layout)


async def sync(llm, loop: EngineLoop, handle: SharedWeights, expected, version: int, *, roll_back_to=None):
    """One weight update as the generator runs it; `roll_back_to`: the engine's counter is reset while paused."""
    previous = loop.version
    async with loop.pause("finish", version):
        await loop.call(load_weights, llm, handle)
        if roll_back_to is not None:
            loop.version = roll_back_to
        return await attest_loaded(loop, llm, expected, previous)


async def reset(llm, loop, versions, version: int):
    """Back to a clean `version` (attested) before the next fault, starting from a counter below it."""
    loop.version = version - 1
    verdict = await sync(
        llm,
        loop,
        publish(versions[version], f"clean-{version}"),
        fingerprint_state_dict(versions[version], version),
        version,
    )
    assert verdict.attested, verdict.failures


async def test_a_clean_sync_is_attested_from_the_bytes_and_through_the_packed_kernels(engine, versions):
    llm, loop = engine
    for version in (1, 2):
        verdict = await asyncio.wait_for(
            sync(
                llm,
                loop,
                publish(versions[version], f"v{version}"),
                fingerprint_state_dict(versions[version], version),
                version,
            ),
            DEADLINE_S,
        )
        assert verdict.attested, verdict.failures
        assert verdict.tensors == len(versions[version])
        assert 0 < verdict.kernel_tensors < verdict.tensors  # linear layers through oneDNN, embedding and norms exact


async def test_a_dropped_tensor_is_detected(engine, versions):
    """vLLM keeps a layer it received nothing for: the previous version's down_proj goes on serving."""
    llm, loop = engine
    await reset(llm, loop, versions, 1)
    dropped = "model.layers.0.mlp.down_proj.weight"
    handle = publish({name: t for name, t in versions[2].items() if name != dropped}, "dropped")
    verdict = await sync(llm, loop, handle, fingerprint_state_dict(versions[2], 2), 2)
    assert [failure.split(":")[0] for failure in verdict.failures] == [dropped]


async def test_a_zeroed_tensor_is_detected(engine, versions):
    llm, loop = engine
    await reset(llm, loop, versions, 1)
    zeroed = "model.layers.1.self_attn.k_proj.weight"  # one part of the fused qkv layer
    handle = publish({**versions[2], zeroed: torch.zeros_like(versions[2][zeroed])}, "zeroed")
    verdict = await sync(llm, loop, handle, fingerprint_state_dict(versions[2], 2), 2)
    assert [failure.split(":")[0] for failure in verdict.failures] == [zeroed]


async def test_a_stale_version_is_detected(engine, versions):
    """The handle of version 1 loaded where version 2 was published: every tensor differs by one small step."""
    llm, loop = engine
    await reset(llm, loop, versions, 1)
    verdict = await sync(llm, loop, publish(versions[1], "stale"), fingerprint_state_dict(versions[2], 2), 2)
    assert {failure.split(":")[0] for failure in verdict.failures} == set(versions[2])


async def test_a_wrong_dtype_is_detected(engine, versions):
    """bf16 bytes published for an fp32 generator: vLLM casts them on load, and the dtype gives it away."""
    llm, loop = engine
    await reset(llm, loop, versions, 1)
    bf16 = {name: tensor.to(torch.bfloat16) for name, tensor in versions[2].items()}
    verdict = await sync(llm, loop, publish(bf16, "bf16"), fingerprint_state_dict(bf16, 2), 2)
    assert len(verdict.failures) == len(versions[2])
    assert "model.norm.weight: served in float32, published in bfloat16" in verdict.failures


async def test_bf16_rounded_weights_where_fp32_was_published_are_detected(engine, versions):
    llm, loop = engine
    await reset(llm, loop, versions, 1)
    verdict = await sync(
        llm, loop, publish(versions[2], "rounded", torch.bfloat16), fingerprint_state_dict(versions[2], 2), 2
    )
    assert {failure.split(":")[0] for failure in verdict.failures} == set(versions[2])


async def test_a_rolled_back_version_counter_is_detected(engine, versions):
    llm, loop = engine
    await reset(llm, loop, versions, 2)
    verdict = await sync(
        llm, loop, publish(versions[2], "rollback"), fingerprint_state_dict(versions[2], 2), 2, roll_back_to=0
    )
    assert verdict.failures == ["serves version 0, published 2", "version counter went from 2 to 0 (not forward)"]


async def test_a_refused_sync_leaves_the_engine_closed(engine, versions):
    """The generator's reload (`reload_proven`, as `Generator.update_weights` calls it) of a tampered publish, version
    1's bytes where version 2's fingerprints were published, refuses it inside the engine's pause: the engine stays
    closed, so no waiting request runs on those weights."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm, loop = engine
    await reset(llm, loop, versions, 1)
    load = functools.partial(loop.call, load_weights, llm, publish(versions[1], "refused"))
    prove = functools.partial(attest_loaded, loop, llm, fingerprint_state_dict(versions[2], 2))
    with pytest.raises(AttestationFailed) as refused:
        await asyncio.wait_for(reload_proven(loop, "finish", 2, load, prove), DEADLINE_S)
    verdict = refused.value.verdict
    assert not verdict.attested and {failure.split(":")[0] for failure in verdict.failures} == set(versions[2])
    assert loop.refused
    waiting = asyncio.ensure_future(
        loop.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), SamplingParams(max_tokens=2, detokenize=False))
    )
    await asyncio.sleep(0.5)
    assert not waiting.done()
    waiting.cancel()


@pytest.fixture(scope="module", autouse=True)
def remove_files():
    yield
    for path in Path(file_path("")).parent.glob(Path(file_path("attestation-test-")).name + "*"):
        path.unlink(missing_ok=True)
