"""`[services]`: deadlines, probes, retries and restart budgets of the replicated roles, and the rollout breaker."""

from __future__ import annotations

from pydantic import Field, model_validator

from rl.config.section import Section


class ServiceConfig(Section):
    """How one role's replicas are called, watched and replaced."""

    call_timeout_s: float = Field(600.0, gt=0)
    """Deadline of one call to a replica (one generation turn, one group's scoring); a replica that misses it is replaced."""
    probe_interval_s: float = Field(2.0, gt=0)
    """An idle replica is pinged this often (and a replica on this host whose process exited is noticed as often)."""
    probe_timeout_s: float = Field(60.0, gt=0)
    """A ping unanswered this long marks the replica lost."""
    start_timeout_s: float = Field(600.0, gt=0)
    """Longest a replica may take to start (and load the current weights); also the longest a call waits for any healthy replica."""
    max_attempts: int = Field(3, ge=1)
    """Replicas one request may be tried on; after that its rollout (and so its group) is an ERROR."""
    max_restarts: int = Field(3, ge=0)
    """Replacements spawned within `restart_window_s`; past it a lost replica stays lost."""
    restart_window_s: float = Field(3600.0, gt=0)
    """The window in which `max_restarts` is counted."""
    min_healthy_replicas: int = Field(1, ge=1)
    """The run stops when fewer replicas than this are healthy or being replaced."""


class RewardServiceConfig(ServiceConfig):
    replicas: int = Field(1, ge=1)
    """RewardActor processes; groups go to the one with the fewest outstanding."""


class BreakerConfig(Section):
    """Stop the run instead of training on a trickle of survivors (a group fails when all its rollouts are errors)."""

    max_consecutive_failed_groups: int = Field(16, ge=1)
    """Stop the run after this many failed groups in a row."""
    window_groups: int = Field(64, ge=1)
    """Groups in the failure-rate window (the rate is checked once the window is full)."""
    max_failure_rate: float = Field(0.5, gt=0, le=1)
    """Stop the run when more than this share of the last `window_groups` groups failed."""


class ServicesConfig(Section):
    generator: ServiceConfig = ServiceConfig()
    """The policy generators (`generator.num_replicas`)."""
    models: ServiceConfig = ServiceConfig()
    """Every frozen model (`[models.<name>]`, `replicas` each)."""
    reward: RewardServiceConfig = RewardServiceConfig()
    """The reward actors."""
    breaker: BreakerConfig = BreakerConfig()
    """The rollout circuit breaker."""

    @model_validator(mode="after")
    def _check(self) -> ServicesConfig:
        if self.reward.min_healthy_replicas > self.reward.replicas:
            raise ValueError(
                f"services.reward.min_healthy_replicas ({self.reward.min_healthy_replicas}) exceeds services.reward.replicas ({self.reward.replicas})"
            )
        return self
