"""A worker process that dies (``os._exit``) while handling one chosen row: poison work.

    python -m tests.poison_worker process|notify|collect MARKER

runs one pass of that stage through the command line, with the stage's handling of any
row whose title (or, for ``collect``, URL) contains MARKER replaced by an abrupt exit,
as a crash in a C extension, the OOM killer or a SIGKILL would end it.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def main(stage: str, marker: str) -> int:
    if stage == "process":
        from pipeline.listings import processor

        normalise = processor.normalise

        def dying_normalise(raw: Any, **kwargs: Any) -> Any:
            if marker in str(raw.get("title")):
                os._exit(3)
            return normalise(raw, **kwargs)

        processor.normalise = dying_normalise  # type: ignore[assignment]
    elif stage == "notify":
        from pipeline.notify import delivery

        send = delivery.WebhookChannel.send

        def dying_send(self: Any, message: Any) -> None:
            if marker in message.listing["title"]:
                os._exit(3)
            send(self, message)

        delivery.WebhookChannel.send = dying_send  # type: ignore[method-assign]
    elif stage == "collect":
        from pipeline.fetching import rss

        fetch = rss.RssAdapter.fetch

        def dying_fetch(self: Any, source: Any, fetcher: Any) -> Any:
            if marker in source["url"]:
                os._exit(3)
            return fetch(self, source, fetcher)

        rss.RssAdapter.fetch = dying_fetch  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown stage {stage!r}")
    from pipeline.cli import main as cli

    return cli([stage, "--json"])


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
