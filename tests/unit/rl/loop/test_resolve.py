"""Resolving a config against the runtime: a frozen model whose token ids reach the loss must share the policy's
tokenizer (its token ids would mean other tokens to the policy), refused before anything starts."""

import pytest

from rl.config import ConfigError, load_config
from rl.loop.resolve import resolve_config, tokenizer_mismatches
from tests.support.paths import E2E_CONFIGS


@pytest.mark.parametrize("role", ["teacher", "sampler"])
def test_a_frozen_model_with_another_tokenizer_is_refused_at_set_up(role):
    kind = "opd" if role == "teacher" else "sft"
    overrides = {
        "models.big.path": "'smollm2-135m-instruct'",  # the policy is tiny-qwen3: Qwen3's tokenizer, not SmolLM2's
        "tasks.0.algorithm": f"{{type = '{kind}', {role} = 'big'}}",
    }
    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", overrides)
    [problem] = tokenizer_mismatches(config)
    assert f"[models.big] (smollm2-135m-instruct), tasks.0 (sum_digits)'s {role}, does not share" in problem
    with pytest.raises(ConfigError, match="does not share the policy's tokenizer"):
        resolve_config(config)  # validate, train, bench and the Controller all resolve
    same = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {**overrides, "models.big.path": "'tiny-qwen3'"})
    assert tokenizer_mismatches(same) == []
