"""Where metrics and sample logs go: wandb and the sample filters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rl.config.section import Section


class WandbConfig(Section):
    enabled: bool = True
    """Log metrics and sample tables to wandb."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """"offline": a local wandb run under the run directory (`wandb sync` uploads it later); "online" needs a
    network and a login."""
    project: str = "rlmesh"
    """The wandb project."""


RankCut = Annotated[int, Field(ge=0)] | Literal["off"]


class SampleFilters(Section):
    """Which trained samples a step logs. All filters combine (AND), except that `reward_below` and
    `reward_above` set together keep either tail (reward <= below OR reward >= above)."""

    step: int = Field(1, ge=1)
    """Log samples at every N-th step only."""
    freq: float = Field(1.0, gt=0, le=1)
    """Fraction of samples kept, drawn at random seeded by `run.seed` and the step."""
    reward_below: float | None = None
    """Keep samples with reward <= this."""
    reward_above: float | None = None
    """Keep samples with reward >= this."""
    abs_advantage_above: float | None = Field(None, ge=0)
    """Keep samples with |advantage| >= this (samples that were not trained have no advantage)."""
    top_k: RankCut = 1
    """Of the samples left, keep the k with the highest reward (ties: lower episode id) ..."""
    bottom_k: RankCut = 1
    """... and the k with the lowest. "off" switches one off; both "off" keep every sample left."""
    predicate: str | None = None
    """Import path `package.module:function` of `fn(sample: dict) -> bool`; False drops the sample."""


class SampleLoggingConfig(Section):
    """Sample-level logging: trained samples to samples.jsonl, a wandb table and (asked for) the console."""

    enabled: bool = True
    """Log trained samples at all."""
    console: bool = False
    """Also print each logged sample on the console, one line each (step, task, reward, advantage, status, the prompt's
    end and the reply's start). Off: the console keeps one line per step; samples.jsonl and wandb have them all."""
    filters: SampleFilters = SampleFilters()
    """Which samples a step logs."""
