"""The claim primitive where the design documents name it: it lives in pipeline/queue/claim.py,
and this module re-exports its public names."""

from pipeline.queue.claim import *
