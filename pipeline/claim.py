"""The claim primitive where the design documents name it: it lives in pipeline/queue/
(claim.py the claim, fenced.py the fenced writes, spec.py what a queue is, heartbeat.py
the leases kept alive), and this module re-exports its public names."""

from pipeline.backends import in_transaction
from pipeline.backends.clock import sql_now
from pipeline.queue.claim import WorkQueue
from pipeline.queue.heartbeat import Heartbeat
from pipeline.queue.spec import (
           UNCLAIMED,
           AgedTerm,
           Claim,
           Fenced,
           OrderTerm,
           QueueSpec,
           Row,
           RowCompletion,
)

__all__ = ["UNCLAIMED", "AgedTerm", "Claim", "Fenced", "Heartbeat", "OrderTerm", "QueueSpec", "Row", "RowCompletion",
           "WorkQueue", "in_transaction", "sql_now"]
