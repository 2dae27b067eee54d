"""The rollout circuit breaker: stop the run when groups keep failing instead of training on the survivors."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rl.config.services import BreakerConfig
from rollouts.types import FAILED_STATUSES, RolloutGroup


def group_failure(group: RolloutGroup) -> tuple[bool, str]:
    """(failed, cause): a group failed when every rollout of it is an ERROR, TIMEOUT or ABORTED."""
    errors = [rollout.error or rollout.status.value for rollout in group.rollouts if rollout.status in FAILED_STATUSES]
    return bool(errors) and len(errors) == len(group.rollouts), (errors[0] if errors else "")[-500:]


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, on_open: Callable[[str], None]):
        """`on_open(message)`: called once, when a limit is crossed (the controller stops the run with the message)."""
        self.config = config
        self.on_open = on_open
        self.open = False
        self.consecutive = 0
        self.window: deque[bool] = deque(maxlen=config.window_groups)

    def record(self, failed: bool, cause: str = "") -> None:
        """One finished group; `cause`: its error, for the message."""
        self.window.append(failed)
        self.consecutive = self.consecutive + 1 if failed else 0
        config, failures = self.config, sum(self.window)
        if self.consecutive >= config.max_consecutive_failed_groups:
            reason = f"{self.consecutive} consecutive groups failed (services.breaker.max_consecutive_failed_groups = {config.max_consecutive_failed_groups})"
        elif len(self.window) == config.window_groups and failures / len(self.window) > config.max_failure_rate:
            reason = f"{failures} of the last {len(self.window)} groups failed (services.breaker.max_failure_rate = {config.max_failure_rate})"
        else:
            return
        if not self.open:
            self.open = True
            self.on_open(f"rollout circuit breaker: {reason}; last error: {cause}")
