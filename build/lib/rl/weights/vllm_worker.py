"""The generator's vLLM worker extension: each worker loads a policy version from a shared file by its handle.

vLLM mixes `WeightLoader` into every worker (`worker_extension_cls`). The generator sends
`collective_rpc("load_shared_weights", args=(handle,))`: a path and a layout, never tensors. Tensors cannot
cross vLLM's multiprocess engine core (msgpack turns them into tuples the loader cannot read, "cannot
pickle memoryview objects"), which every tensor-parallel engine uses; with a handle, each worker maps the
file and copies the bytes into its own shard of the model (`reload_weights` copies in place, so CUDA graphs
stay valid).
"""

from __future__ import annotations

from rl.weights.shared_file import MappedFiles, SharedWeights

QUALNAME = "rl.weights.vllm_worker.WeightLoader"
"""What the generator passes as vLLM's `worker_extension_cls`."""


class WeightLoader:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def load_shared_weights(self, message: dict) -> None:
        """Reload the model in place from the file `message` (a `SharedWeights.to_message()`) names."""
        if not hasattr(self, "_rlmesh_files"):
            self._rlmesh_files = MappedFiles()
        state_dict = self._rlmesh_files.state_dict(SharedWeights.from_message(message))
        self.reload_weights(weights_iterator=list(state_dict.items()))
