"""The process's heap, settled once before the stages' first pass.

CPython's cycle collector looks at every tracked object in its oldest generation at each
full collection. What a process imported before it does any work (Dagster, SQLAlchemy,
the Public Suffix List's trie: about 200,000 objects in a run's process) lives as long
as the process and holds no garbage, yet every full collection walked it again: a
processor pass ran seven of them per 20,000 rows, 31-33 us of its CPU a row, an eighth
of it (bench/RESULTS.md, "The heap settled"). ``settle`` collects once and moves what is
left out of the collector's sight (``gc.freeze``), where it is never looked at again;
what the process makes afterwards is collected as before. An object alive at that
moment that later becomes garbage in a cycle is not reclaimed: a one-time snapshot of a
process starting its work, not something to repeat.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_settled = False


def settle() -> None:
    """Collect, then freeze what is left: once per process; later calls do nothing."""
    global _settled
    if _settled:
        return
    with _lock:
        if not _settled:
            gc.collect()
            gc.freeze()
            _settled = True
