"""An actor that records metrics in its own process, for the cross-process gathering test."""

import asyncio

from monarch.actor import current_rank, endpoint

from rl.metrics import Reduce, record_metric
from rl.metrics.actor import MetricsActor


class Recorder(MetricsActor):
    @endpoint
    async def record(self) -> None:
        """Rank r records the values r*10 + 1, ..., r*10 + (r + 1): rank 0 one value, rank 1 two."""
        rank = current_rank().rank
        for index in range(rank + 1):
            value = rank * 10 + index + 1
            record_metric("replica/value", value, Reduce.MEAN)
            record_metric("replica/std", value, Reduce.STD)
            record_metric("replica/max", value, Reduce.MAX)
            record_metric("replica/samples", {"rank": rank, "value": value}, Reduce.SAMPLE)

    @endpoint
    async def hang(self) -> None:
        """Never answers: the process is alive, its actor busy."""
        await asyncio.Event().wait()
