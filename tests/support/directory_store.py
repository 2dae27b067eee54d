"""A key-value store with the calls the weight sync makes of torchstore (`put`, `get`, `exists`, `delete`, `keys`), kept
as files in one directory: the delta publisher and receiver run on it in one process or across a test's spawned ranks,
without Monarch. Values are serialized on `put` (`torch.save`), so a reader never shares memory with the writer, as
with torchstore's volumes; a DTensor's shards are not assembled (the shared-memory transport never puts one)."""

from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
import torch


class DirectoryStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root / quote(key, safe="")

    async def put(self, key: str, value: Any) -> None:
        staged = self._path(key).with_name(self._path(key).name + ".part")
        torch.save(value, staged)
        staged.rename(self._path(key))  # whole or absent, as a store's put

    async def get(self, key: str) -> Any:
        path = self._path(key)
        if not path.exists():
            raise KeyError(key)
        return torch.load(path, weights_only=False)

    async def exists(self, key: str) -> bool:
        return self._path(key).exists()

    async def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    async def keys(self) -> list[str]:
        return [unquote(path.name) for path in self.root.iterdir() if not path.name.endswith(".part")]


def use_directory_store(root: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> DirectoryStore:
    """Route the weight sync's store calls (`rl.weights.sync`, `rl.weights.delta_sync`) to a `DirectoryStore` at
    `root` (through `monkeypatch` in a test, or for good in a spawned rank's process)."""
    from rl.weights import delta_sync, sync

    store = DirectoryStore(root)
    for module in (sync, delta_sync):
        if monkeypatch is None:
            module.ts = store
        else:
            monkeypatch.setattr(module, "ts", store)
    return store
