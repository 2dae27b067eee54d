"""The typed configuration of a run, read from TOML and dotted CLI overrides: one module per concept.

    roles    [model], [generator], [trainer], [weight_sync]
    tasks    [[tasks]] with their data and rubric
    run      [run], [checkpoint]
    metrics  [wandb], [sample_logging]
    cluster  [cluster]
    root     the whole `Config`, `load_config` (TOML + overrides) and `dump_toml`

Every section forbids unknown keys and checks types, so a typo or a wrong type fails before any actor starts,
with the offending key named (`trainer.lrr: Extra inputs are not permitted`).
"""

from rl.config.root import Config, ConfigError, apply_override, dump_toml, load_config

__all__ = ["Config", "ConfigError", "apply_override", "dump_toml", "load_config"]
