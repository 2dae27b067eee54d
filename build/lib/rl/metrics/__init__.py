"""One metrics system for the run: `record_metric` anywhere, reduced across processes once a step; the
loggers and backends, generation and rollout statistics, sample logs and reports.

Holds only the three names task and actor code record with (`from rl.metrics import Reduce, record_metric, timer`)."""

from rl.metrics.reduce import Reduce, record_metric
from rl.metrics.timer import timer

__all__ = ["Reduce", "record_metric", "timer"]
