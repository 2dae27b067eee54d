"""Starting a vLLM engine in the pytest process (the Generator actor's engine, without its actor), as
tests/e2e/test_engine_loop.py and tests/e2e/test_attestation.py do, and watching its steps."""

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def werkzeug_proxies_hidden() -> Iterator[None]:
    """Modules holding werkzeug context proxies (flask's `request`, `g`, ...) out of `sys.modules` for a while.

    vLLM's CPU kernel registration calls `hasattr` on every attribute of every loaded module, and such a proxy raises
    "Working outside of application context" instead of AttributeError. `monarch.job` imports flask, so an engine
    could not start in a process that had built a monarch job before (a pytest-xdist worker may run such a module
    first)."""
    if "werkzeug.local" not in sys.modules:
        yield
        return
    from werkzeug.local import LocalProxy

    hidden = {
        name: module
        for name, module in list(sys.modules.items())
        if module is not None and any(issubclass(type(value), LocalProxy) for value in list(vars(module).values()))
    }
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


@contextlib.contextmanager
def step_sizes(llm: Any) -> Iterator[list[int]]:
    """While inside: the number of unfinished requests at each step of `llm`'s engine, appended as it steps."""
    engine = llm.llm_engine
    sizes: list[int] = []
    step = engine.step

    def counting_step():
        sizes.append(engine.get_num_unfinished_requests())
        return step()

    engine.step = counting_step
    try:
        yield sizes
    finally:
        del engine.step  # the class's step again


def tiny_lora_llm(rank: int, alpha: int, tenants: int = 1) -> Any:
    """vLLM's `LLM` on the tiny Qwen3 in this process, built as the e2e config's generator builds its engine, serving
    LoRA adapters of `rank` and `alpha` (`tenants` adapter slots); shut it down with
    `llm.llm_engine.engine_core.shutdown()`."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    from actors.generator import engine_args, lora_engine_args
    from rl.assets import resolve_model_path
    from rl.config import load_config
    from rl.config.lora import LoraConfig
    from rl.loop.resolve import resolve_config
    from tests.support.paths import E2E_CONFIGS

    generator_config = resolve_config(load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml")).generator
    with werkzeug_proxies_hidden():
        return LLM(
            model=resolve_model_path("tiny-qwen3"),
            **engine_args(generator_config),
            **lora_engine_args(LoraConfig(enabled=True, rank=rank, alpha=alpha), tenants),
        )
