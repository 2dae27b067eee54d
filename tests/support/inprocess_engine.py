"""Starting a vLLM engine in the pytest process (the Generator actor's engine, without its actor), as
tests/e2e/test_engine_loop.py and tests/e2e/test_attestation.py do, and watching its steps."""

import contextlib
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
