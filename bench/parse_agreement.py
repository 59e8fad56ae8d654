"""The feed parser's fast path against feedparser: agreement field by field, and CPU.

For every feed of a corpus (``../shared/corpus``: its manifest.json names each file and
the headers it is served with), ``read_feed`` runs twice: as the project runs it (the
fast path, pipeline/fetching/quickfeed.py, where it applies) and with the fast path
switched off (feedparser alone). The items must be the same, every stored field of every
item, and the feed's site, or the same failure; the script prints how many feeds took
the fast path, how many disagree (listing them), how many items differ in each field,
and the CPU per feed of each side over the feeds that took the fast path. Exit status 1 when any feed disagrees.

    .venv/bin/python bench/parse_agreement.py ../shared/corpus

The corpus is test data from other projects: it is read where it is, never copied here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.core.errors import FetchError
from pipeline.fetching import quickfeed, rss

REAL_PARSE = quickfeed.parse
# What is compared of each item: its identity, where it was found, and each raw field.
FIELDS = ("source_item_id", "item url", "title", "url", "summary", "published_at", "author", "categories")


def parsed(body: bytes, url: str, content_type: str | None, *, fast: bool) -> tuple[Any, bool, float]:
    """(items and the feed's site, or the failure; whether the fast path read it; CPU
    seconds). The fast path is switched off where read_feed calls it (``quickfeed.parse``)."""
    used: list[bool] = []

    def parse(document: bytes, detected: Any) -> Any:
        result = REAL_PARSE(document, detected) if fast else None
        used.append(result is not None)
        return result

    quickfeed.parse = parse  # type: ignore[assignment]
    started = time.process_time()
    try:
        read = rss.read_feed(body, url, content_type)
        outcome: Any = ([{"source_item_id": i.source_item_id, "item url": i.url, **{f: i.raw.get(f) for f in FIELDS[2:]}}
                         for i in read.items], read.site_url)
    except FetchError as error:
        outcome = (error.reason, str(error))
    finally:
        quickfeed.parse = REAL_PARSE
    return outcome, any(used), time.process_time() - started


def differing_fields(fast: Any, slow: Any) -> dict[str, int]:
    """How many items differ in each field (``items`` when the item lists differ in
    length, ``site`` for the feed's site, ``outcome`` when one side failed)."""
    if not (isinstance(fast, tuple) and isinstance(fast[0], list) and isinstance(slow[0], list)):
        return {"outcome": 1}
    counts = {"site": int(fast[1] != slow[1])}
    if len(fast[0]) != len(slow[0]):
        counts["items"] = 1
        return counts
    for field in FIELDS:
        counts[field] = sum(a[field] != b[field] for a, b in zip(fast[0], slow[0], strict=True))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="a directory with manifest.json and feeds/")
    args = parser.parse_args()
    manifest = json.loads((args.corpus / "manifest.json").read_text())["feeds"]
    took, disagree, fast_cpu, slow_cpu = 0, [], 0.0, 0.0
    fields: dict[str, int] = dict.fromkeys(("outcome", "items", "site", *FIELDS), 0)
    for feed in manifest:
        body = (args.corpus / "feeds" / feed["path"]).read_bytes()
        content_type = feed.get("headers", {}).get("Content-Type")
        url = "http://127.0.0.1/" + feed["path"]
        fast, used, fast_seconds = parsed(body, url, content_type, fast=True)
        slow, _, slow_seconds = parsed(body, url, content_type, fast=False)
        if fast != slow:
            disagree.append(feed["path"])
            for field, count in differing_fields(fast, slow).items():
                fields[field] += count
        if used:
            took += 1
            fast_cpu += fast_seconds
            slow_cpu += slow_seconds
    print(f"{len(manifest)} feeds: {took} read by the fast path, {len(manifest) - took} by feedparser alone;"
          f" {len(disagree)} disagree")
    for path in disagree:
        print(f"  disagrees: {path}")
    print("items differing, by field: " + ", ".join(f"{field} {count}" for field, count in fields.items()))
    if took:
        print(f"CPU per feed on the fast path's feeds: fast path {fast_cpu / took * 1000:.2f} ms,"
              f" feedparser {slow_cpu / took * 1000:.2f} ms ({slow_cpu / fast_cpu:.1f}x)")
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
