"""The typed configuration of a run, read from TOML and dotted CLI overrides: one module per concept.

    section    the base of every section, and the words they share (device, dtype)
    roles      [model], [generator], [trainer], [weight_sync], [models.<name>]
    lora       [trainer.lora]
    algorithm  [algorithm] (how scored groups become samples), the bypass rule
    loss       [loss] (the policy loss by name or import path, clipping, aggregation, KL, rollout correction)
    tasks      [[tasks]] with their data, rubric, renderer and rollout limits
    services   [services]
    run        [run], [checkpoint]
    metrics    [wandb], [sample_logging]
    cluster    [cluster]
    root       the whole `Config`, `load_config` (TOML + overrides) and `dump_toml`

Every section forbids unknown keys and checks types, so a typo or a wrong type fails before any actor starts,
with the offending key named (`trainer.lrr: Extra inputs are not permitted`). This package imports no runtime
code (tests/test_layout.py): what needs the algorithm classes, the assets, the renderers or torch is checked and
decided by `rl.loop.resolve.resolve_config`, which every entry point runs after loading.
"""

from rl.config.root import Config, ConfigError, apply_override, dump_toml, load_config

__all__ = ["Config", "ConfigError", "apply_override", "dump_toml", "load_config"]
