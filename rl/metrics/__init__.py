"""One metrics system for the run: `record_metric` anywhere, reduced across processes once a step."""

from rl.metrics.logger import MetricsLogger
from rl.metrics.reduce import Reduce, record_metric
from rl.metrics.timer import timer

__all__ = ["MetricsLogger", "Reduce", "record_metric", "timer"]
