"""The generator's vLLM worker extension: each worker loads a policy version from a shared file by its handle.

vLLM mixes `WeightLoader` into every worker (`worker_extension_cls`). The generator sends
`collective_rpc("load_shared_weights", args=(handle,))`: a path and a layout, never tensors. Tensors cannot
cross vLLM's multiprocess engine core (msgpack turns them into tuples the loader cannot read, "cannot
pickle memoryview objects"), which every tensor-parallel engine uses; with a handle, each worker maps the
file and copies the bytes into its own shard of the model (`reload_weights` copies in place, so CUDA graphs
stay valid). After a load, `fingerprint_loaded` measures what the worker's model holds
(`rl.weights.vllm_attest`) so the generator can prove the version it serves; after a LoRA adapter's load,
`fingerprint_adapter` measures the adapter in the worker's LoRA layers. A CPU generator first has each worker compute
single rows as in a batch (`single_rows_as_in_a_batch`, `rl.processes.single_rows`).
"""

from __future__ import annotations

from rl.weights.shared_file import MappedFiles, SharedWeights

QUALNAME = "rl.weights.vllm_worker.WeightLoader"
"""What the generator passes as vLLM's `worker_extension_cls`."""


class WeightLoader:
    """Mixed into vLLM's worker class; `self` is the worker."""

    def single_rows_as_in_a_batch(self) -> None:
        """This worker's CPU linear layers give a row the same bits alone as in a batch (`rl.processes.single_rows`)."""
        from rl.processes.single_rows import single_rows_as_in_a_batch

        single_rows_as_in_a_batch()

    def load_shared_weights(self, message: dict) -> None:
        """Reload the model in place from the file `message` (a `SharedWeights.to_message()`) names."""
        if not hasattr(self, "_rlmesh_files"):
            self._rlmesh_files = MappedFiles()
        state_dict = self._rlmesh_files.state_dict(SharedWeights.from_message(message))
        self.reload_weights(weights_iterator=list(state_dict.items()))

    def fingerprint_loaded(self, message: dict) -> list[list]:
        """Fingerprint pieces (as plain lists) of the published tensors `message` names (a `Fingerprints.to_message()`),
        measured on this worker's loaded model."""
        from rl.weights.vllm_attest import loaded_pieces

        shapes = {name: tuple(shape) for name, (shape, _) in message["tensors"].items()}
        pieces = loaded_pieces(self.model_runner.get_model(), shapes, int(message["seed"]))
        return [piece.to_message() for piece in pieces]

    def fingerprint_adapter(self, message: dict, lora_int_id: int, scaling: float) -> list[list]:
        """Fingerprint pieces (as plain lists) of the published adapter tensors `message` names, measured in the
        LoRA slot this worker holds adapter `lora_int_id` in (`scaling`: alpha / rank, folded into B by vLLM)."""
        from rl.weights.vllm_attest import adapter_pieces

        shapes = {name: tuple(shape) for name, (shape, _) in message["tensors"].items()}
        manager = self.model_runner.lora_manager._adapter_manager  # vLLM's LoRAModelManager: slots and LoRA layers
        pieces = adapter_pieces(manager, lora_int_id, shapes, scaling, int(message["seed"]))
        return [piece.to_message() for piece in pieces]
