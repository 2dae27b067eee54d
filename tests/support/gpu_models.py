"""Models and ports for the GPU suite: built from configs, so the suite needs no model files and no registry."""

import socket

import torch


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def random_qwen3(attention: str = "sdpa", seed: int = 0, **shape) -> torch.nn.Module:
    """A random-weight Qwen3 (tied embeddings, grouped-query attention) built from its config: no files needed."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        **{
            "vocab_size": 1024,
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 32,
            "tie_word_embeddings": True,
            "max_position_embeddings": 4096,
            **shape,
        }
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
