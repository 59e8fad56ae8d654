"""What a reader shows against what the project stores, item by item, on a feed corpus.

For every feed of a corpus (``../shared/corpus``: manifest.json names each file and the
headers it is served with), feedparser alone reads the bytes, and each entry's title and
summary are taken as a reader shows them: plain text as it is, HTML (and XHTML) as
html.parser renders it (tags dropped, entities decoded, scripts and styles left out),
white space collapsed. The project reads the same bytes (``read_feed``) and normalises
each item (``normalise``), as the collector and the processor do. Printed: how many
items differ in each field, what the differences look like, and how many items were
given the feed's own URL as their link (a false link: the reader lands on XML).

    .venv/bin/python bench/reader_agreement.py ../shared/corpus [--show 20]

Not a pass/fail check: feedparser is not always right (an undeclared EUC-JP feed is
mojibake to it, not to the project); the counts say where the two differ, before and
after a change. The corpus is other projects' test data: it is read where it is, never
copied here.
"""

from __future__ import annotations

import argparse
import collections
import html.parser
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import feedparser

from pipeline.core.errors import PipelineError
from pipeline.fetching import rss
from pipeline.listings.normalize import SUMMARY_CHARS, TITLE_CHARS, normalise


class _Shown(html.parser.HTMLParser):
    """The text of an HTML fragment as a browser shows it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.hidden += tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self.hidden:
            self.hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def detail(entry: Any, field: str) -> Any:
    """feedparser's detail of an entry's field; a summary it copied from the content has
    none of its own: the content's."""
    own = entry.get(f"{field}_detail")
    content = entry.get("content") or []
    if own is None and field == "summary" and content and content[0].get("value") == entry.get("summary"):
        return content[0]
    return own


def shown(detail: Any, value: Any) -> str:
    """A feedparser text field as a reader shows it, by its type."""
    if not value:
        return ""
    if (detail or {}).get("type") == "text/plain":
        return " ".join(str(value).split())
    parser = _Shown()
    parser.feed(str(value))
    parser.close()
    return " ".join("".join(parser.parts).split())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path, help="a directory with manifest.json and feeds/")
    parser.add_argument("--show", type=int, default=10, help="differences to print per field")
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    examples: dict[str, list[tuple[str, str, str]]] = collections.defaultdict(list)
    for feed in json.loads((args.corpus / "manifest.json").read_text())["feeds"]:
        body = (args.corpus / "feeds" / feed["path"]).read_bytes()
        content_type = feed.get("headers", {}).get("Content-Type")
        url = "http://127.0.0.1/" + feed["path"]
        try:
            items = rss.read_feed(body, url, content_type).items
        except PipelineError:
            counts["feeds refused"] += 1
            continue
        entries = feedparser.parse(body, response_headers={"content-type": content_type} if content_type else {},
                                   sanitize_html=False, resolve_relative_uris=False).entries
        if len(entries) != len(items):
            counts["feeds whose entries differ in number"] += 1
            continue
        for entry, item in zip(entries, items, strict=True):
            try:
                listing = normalise(item.raw, fallback_url=item.url)
            except PipelineError:
                counts["items refused"] += 1
                continue
            counts["items"] += 1
            for field, limit in (("title", TITLE_CHARS), ("summary", SUMMARY_CHARS)):
                want, got = shown(detail(entry, field), entry.get(field)), getattr(listing, field)
                if len(want) <= limit and want and got != want:
                    counts[f"{field} differs"] += 1
                    start = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
                    examples[field].append((feed["path"], want[max(0, start - 20):start + 50], got[max(0, start - 20):start + 50]))
            if listing.url == url:
                counts["link is the feed's URL"] += 1
    print(", ".join(f"{key} {value}" for key, value in counts.items()))
    for field, rows in examples.items():
        for path, want, got in rows[:args.show]:
            print(f"  {field}: {path}\n    reader {want!r}\n    stored {got!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
