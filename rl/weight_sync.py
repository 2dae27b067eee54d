"""Versioned policy weights in torchstore: the trainer pushes, generators pull.

Topology (as torchforge does it): ``initialize_store()`` runs once in the launcher with
``ControllerStorageVolumes``. torchstore's ``Controller`` (metadata) and its single ``StorageVolume``
(the tensors) are then named singletons ("TorchStore", "storage_volume_controller") spawned in the
launcher's process by monarch's ``_ControllerController``: no extra process to start or stop, at the
cost of the launcher holding one copy of the weights. Every actor spawned from the launcher (directly
or transitively) inherits that ``_ControllerController`` handle, so ``push_state_dict`` /
``pull_state_dict`` find the store by name from any process, without passing handles around.
Modules defining such actors must import this module (or ``rl.torchstore_compat``) at top level so
the compat patch also runs in their process.

Each version is stored as ``policy/v{N}/<param>`` plus ``policy/v{N}/MAPPING``; torchstore writes
``MAPPING`` last, so pulling a version whose push has not finished fails instead of returning a
partial state dict.
"""

import asyncio

import torch

from rl.torchstore_compat import import_torchstore

ts = import_torchstore()

KEY_PREFIX = "policy/v"


def policy_key(policy_version: int) -> str:
    """The torchstore key of one policy version's state dict."""
    return f"{KEY_PREFIX}{policy_version}"


async def initialize_store() -> None:
    """Start the store; call once, from the launcher, before any actor pushes or pulls."""
    await ts.initialize(strategy=ts.ControllerStorageVolumes())


async def shutdown_store() -> None:
    """Drop all stored data and metadata (launcher only); ``initialize_store()`` may follow again."""
    await ts.shutdown()


async def stored_versions() -> list[int]:
    """Policy versions currently in the store, ascending.

    Filters ``keys()`` here: torchstore's prefix filter splits keys on "." and misses "/" prefixes.
    """
    keys = [k for k in await ts.keys() if k.startswith(KEY_PREFIX)]
    return sorted({int(k[len(KEY_PREFIX) :].split("/", 1)[0]) for k in keys})


async def _delete_version(policy_version: int) -> None:
    """Delete all keys of one version; ``MAPPING`` first so readers fail fast, not half-read."""
    prefix = policy_key(policy_version) + "/"
    await ts.delete(prefix + "MAPPING")
    keys = [k for k in await ts.keys() if k.startswith(prefix)]
    await asyncio.gather(*(ts.delete(k) for k in keys))


async def push_state_dict(
    state_dict: dict[str, torch.Tensor], policy_version: int, *, keep_versions: int = 1
) -> None:
    """Store ``state_dict`` as ``policy_version`` and delete all but the newest ``keep_versions``.

    Use ``keep_versions >= 2`` if generators may still be pulling the previous version.
    """
    if keep_versions < 1:
        raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
    await ts.put_state_dict(state_dict, policy_key(policy_version))
    for stale in (await stored_versions())[:-keep_versions]:
        await _delete_version(stale)


async def pull_state_dict(
    policy_version: int, *, template: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Fetch ``policy_version``; with ``template`` (same keys) the values are copied into its tensors."""
    return await ts.get_state_dict(policy_key(policy_version), user_state_dict=template)
