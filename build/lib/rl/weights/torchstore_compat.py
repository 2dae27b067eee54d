"""Make torchstore 0.1.2 usable on torchmonarch 0.7.0.

Why: torchstore 0.1.2 was written against torchmonarch 0.1.2. Since monarch 0.2.0 an actor class
must be either all-sync or all-async (``monarch._src.actor.actor_mesh._actor_kind``), and
torchstore's ``Controller`` mixes both: ``init`` / ``teardown`` are async while
``get_controller_strategy``, ``keys``, ``locate_volumes``, ``notify_delete`` and ``notify_put`` are
plain ``def``. Monarch then raises ``ValueError: ... mixes both async and sync endpoints``.

Fix: wrap those five sync methods in ``async def`` wrappers (they never block or await, so running
them on the actor's event loop is safe). ``StorageVolume`` is already all-async and is the only
other torchstore actor, so it is left alone.

Where it must run: monarch checks the actor kind not only when spawning the actor (in the launcher,
whose ``_ControllerController`` hosts the Controller) but also whenever an ``ActorMesh[Controller]``
handle is built, i.e. in *every* process that unpickles a Controller handle (every torchstore
client). So import this module, not ``torchstore``, from any module that defines actors using the
store: the patch is applied on import, and ``import_torchstore()`` returns the patched module.
"""

import functools
import inspect
import os
from collections.abc import Callable, Coroutine
from types import ModuleType
from typing import Any

_SYNC_CONTROLLER_ENDPOINTS = (
    "get_controller_strategy",
    "keys",
    "locate_volumes",
    "notify_delete",
    "notify_put",
)


def _as_async(method: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """An ``async def`` with the same name/signature that just calls the sync ``method``."""

    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return method(*args, **kwargs)

    return wrapper


def import_torchstore() -> ModuleType:
    """Import torchstore, make its Controller all-async (idempotent) and return the module."""
    # torchstore sets this frame limit itself, with a console warning, when it is unset: set its value quietly.
    os.environ.setdefault("HYPERACTOR_CODEC_MAX_FRAME_LENGTH", "910737418240")
    import torchstore
    from torchstore.controller import Controller

    for name in _SYNC_CONTROLLER_ENDPOINTS:
        prop = Controller.__dict__[name]  # monarch EndpointProperty; keeps its options
        if not inspect.iscoroutinefunction(prop._method):
            prop._method = _as_async(prop._method)
    return torchstore


import_torchstore()
