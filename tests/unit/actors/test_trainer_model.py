"""The trainer refuses, before loading any weight, prefix-shared training of a model with recurrent layers; the
launcher refuses it before anything starts."""

import pytest
import transformers

from actors.trainer import load_causal_lm
from rl.commands.cli import main
from rl.config.roles import TrainerConfig


@pytest.fixture
def gated_delta_net_model(tmp_path):
    """A Qwen3-Next config (gated delta nets and full attention), no weights: the refusal comes before them."""
    small = dict(vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=32, num_experts=4)
    transformers.Qwen3NextConfig(num_hidden_layers=4, **small).save_pretrained(tmp_path)
    return str(tmp_path)


def test_trainer_refuses_prefix_sharing_before_loading_weights(gated_delta_net_model):
    with pytest.raises(ValueError, match=r"layer_types include \['linear_attention'\].*trainer.prefix_sharing = false"):
        load_causal_lm(gated_delta_net_model, TrainerConfig())
    with pytest.raises(OSError):  # without prefix sharing it goes on to the (missing) weights
        load_causal_lm(gated_delta_net_model, TrainerConfig(prefix_sharing=False))


def test_validate_refuses_prefix_sharing_of_a_hybrid_model(gated_delta_net_model, capsys):
    assert main(["validate", "--model.path", gated_delta_net_model]) == 2
    assert "Set trainer.prefix_sharing = false" in capsys.readouterr().err
    assert main(["validate", "--model.path", gated_delta_net_model, "--trainer.prefix_sharing", "false"]) == 0
