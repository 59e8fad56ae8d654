"""How well the story detector (pipeline/listings/stories.py) tells one story from two.

Not a speed benchmark: a measurement of precision and recall on a labelled sample.

The sample is built from a corpus of real feeds (``--corpus``: a directory with
``manifest.json`` and ``feeds/``, e.g. ../shared/corpus, which is test data and is never
copied here). Every feed is read by the project's own parser and normaliser, each feed a
source. Then:

* **Natural pairs**: every pair of listings from two different feeds that the detector
  puts in one story (by the rules of ``stories.same_story``, candidates found by the
  same keys the database uses). Each is labelled: an exact copy (same title, summary
  and story URL) is the same story; every other flagged pair is printed for a person
  to label, and the labels a person gave are read from ``--labels`` (a JSON object
  mapping the pair's key to "same" or "different"). A pair without a label counts as
  unlabelled and is reported as such, never guessed.
* **Made copies**: for a random sample of listings with a fingerprint, a copy as
  another outlet would syndicate it (each transformation below) from another source;
  each is a known positive, and tells the recall of each transformation.

* **Items of one feed**: every pair of two items of one feed whose texts the text rule
  would join were they from two sources: a feed's items are its stories, so each is a
  false positive (pairs with the very same words are left out: a repost, ambiguous).

Precision of the text rule (SimHash, the judgement) = true / (true + false) over the
natural copies, the made copies it found and the items of one feed it would join;
recall per transformation = made copies found / made. The link rule is exact by
construction: pairs sharing a link with other texts are counted, not judged.

    .venv/bin/python bench/story_precision.py --corpus ../shared/corpus --labels bench/story_labels.json
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.core.errors import PipelineError
from pipeline.fetching.rss import parse_feed
from pipeline.listings import boilerplate, stories
from pipeline.listings.normalize import Listing, normalise
from pipeline.listings.stories import NewListing


class Entry:
    """A listing of the sample: what the detector sees, and where it came from;
    ``plate``: its source's boilerplate (pipeline/listings/boilerplate.py)."""

    def __init__(self, number: int, source: int, feed: str, item: str, listing: Listing,
                 plate: boilerplate.Runs = boilerplate.NONE) -> None:
        self.number, self.source, self.feed, self.item, self.listing = number, source, feed, item, listing
        self.story = NewListing(number, source, stories.Marks.of(listing, boilerplate=plate))
        self.marks = self.story.marks

    @property
    def key(self) -> str:
        return f"{self.feed}#{self.item}"


def read_corpus(corpus: Path, *, apply: bool = True) -> tuple[list[Entry], dict[int, boilerplate.Runs]]:
    """The sample's listings, and each feed's boilerplate as the processor learns it when
    the feed's items arrive together (its first fetch), left out of their fingerprints
    where ``apply``."""
    manifest = json.loads((corpus / "manifest.json").read_text())
    entries: list[Entry] = []
    plates: dict[int, boilerplate.Runs] = {}
    for source, feed in enumerate(manifest["feeds"]):
        body = (corpus / "feeds" / feed["path"]).read_bytes()
        url = f"http://corpus.invalid/{quote(feed['path'])}"
        try:
            items = parse_feed(body, url, feed.get("headers", {}).get("Content-Type"))
        except (PipelineError, ValueError):
            continue
        seen = set()
        listings = []
        for item in items:
            try:
                listing = normalise(item.raw, fallback_url=item.url)
            except PipelineError:
                continue
            if item.source_item_id in seen:
                continue
            seen.add(item.source_item_id)
            listings.append((item.source_item_id, listing))
        words = [stories.Marks.words_of(listing) for _, listing in listings]
        plate = plates[source] = boilerplate.common(words) if len(words) >= boilerplate.SAMPLE else boilerplate.NONE
        for item_id, listing in listings:
            entries.append(Entry(len(entries), source, feed["path"], item_id, listing, plate if apply else boilerplate.NONE))
    return entries, plates


def flagged_pairs(entries: list[Entry]) -> Iterator[tuple[Entry, Entry, str]]:
    """Every pair of entries of two sources the detector joins, with the rule that did."""
    by_key: dict[int, list[Entry]] = collections.defaultdict(list)
    for entry in entries:
        for key in entry.marks.keys:
            by_key[key].append(entry)
    seen: set[tuple[int, int]] = set()
    for group in by_key.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                pair = (min(a.number, b.number), max(a.number, b.number))
                if pair in seen or not stories.same_story(a.story, b.story):
                    continue
                seen.add(pair)
                by_url = a.marks.url_key is not None and a.marks.url_key == b.marks.url_key
                yield a, b, "link" if by_url else "text"


def own_words(e: Entry) -> tuple[str, ...]:
    """The words a fingerprint is made of (stories.Marks.of)."""
    return tuple(dict.fromkeys(stories.Marks.words_of(e.listing)))


def exact_copy(a: Entry, b: Entry) -> bool:
    """The same words, or the same story URL and the same title and summary."""
    la, lb = a.listing, b.listing
    return own_words(a) == own_words(b) or (la.title, la.summary, a.marks.url_key) == (lb.title, lb.summary, b.marks.url_key)


def near_pairs_within_feeds(entries: list[Entry]) -> Iterator[tuple[Entry, Entry]]:
    """Pairs of items of one feed whose fingerprints the text rule would join were they
    from two sources: two items of one feed are two stories (a feed's own ids say so),
    so each is a false positive, unless the two have the same words (a feed repeating
    an item under a new id, left out as ambiguous)."""
    by_feed: dict[int, list[Entry]] = collections.defaultdict(list)
    for e in entries:
        if e.marks.fingerprint is not None:
            by_feed[e.source].append(e)
    for items in by_feed.values():
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                assert a.marks.fingerprint is not None and b.marks.fingerprint is not None
                if (stories.distance(a.marks.fingerprint, b.marks.fingerprint) <= stories.MAX_DISTANCE
                        and stories.titles_agree(a.marks.title_words, b.marks.title_words) and own_words(a) != own_words(b)):
                    yield a, b


# How another outlet carries a story: each a function of (title, summary, url, rng).
Copy = Callable[[str, str, str, random.Random], tuple[str, str, str]]
COPIES: dict[str, Copy] = {
    "same text, link with utm_* tags": lambda t, s, u, r: (
        t, s, u + ("&" if "?" in u else "?") + "utm_source=feed&utm_medium=rss&utm_campaign=x"),
    "same text, another link": lambda t, s, u, r: (t, s, f"https://mirror{r.randint(1, 99)}.example/{r.random()}"),
    "title suffixed with the outlet, another link": lambda t, s, u, r: (
        f"{t} | The Daily Example", s, f"https://daily.example/{r.random()}"),
    "summary with a 'read more' line, another link": lambda t, s, u, r: (
        t, f"{s} Read more at The Daily Example.", f"https://daily.example/{r.random()}"),
    "summary cut at 80% with an ellipsis, another link": lambda t, s, u, r: (
        t, s[: int(len(s) * 0.8)].rsplit(" ", 1)[0] + " …", f"https://daily.example/{r.random()}"),
    "one word of the summary changed, another link": lambda t, s, u, r: (
        t, _change_one_word(s, r), f"https://daily.example/{r.random()}"),
}


def _change_one_word(text: str, rng: random.Random) -> str:
    words = text.split()
    if words:
        words[rng.randrange(len(words))] = "edited"
    return " ".join(words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--labels", type=Path, help="JSON: pair key -> 'same' or 'different'")
    parser.add_argument("--made", type=int, default=500, help="listings sampled for made copies")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=40, help="unlabelled pairs to print")
    parser.add_argument("--whole", action="store_true",
                        help="fingerprint every text whole, as before sources' boilerplate was left out")
    args = parser.parse_args()
    labels: dict[str, str] = json.loads(args.labels.read_text()) if args.labels else {}

    entries, plates = read_corpus(args.corpus, apply=not args.whole)
    outlets = [plate for plate in plates.values() if plate]  # the boilerplate of the feeds that have one
    print(f"feeds with boilerplate: {len(outlets):,} of {len(plates):,}"
          f" (learned from {boilerplate.SAMPLE}+ items at once: the runs of phrases of {boilerplate.PHRASE} words all of them have)")
    sources = len({e.source for e in entries})
    printed = sum(1 for e in entries if e.marks.fingerprint is not None)
    print(f"sample: {len(entries):,} listings from {sources:,} feeds; {printed:,} with a fingerprint"
          f" (>= {stories.MIN_WORDS} distinct words)")

    tally: collections.Counter[tuple[str, str]] = collections.Counter()
    unlabelled = []
    for a, b, rule in flagged_pairs(entries):
        key = " | ".join(sorted((a.key, b.key)))
        label = "same" if exact_copy(a, b) else labels.get(key)
        tally[(rule, label or "unlabelled")] += 1
        if label is None:
            unlabelled.append((key, rule, a, b))
    for key, rule, a, b in [u for u in unlabelled if u[1] == "text"][: args.show] + [u for u in unlabelled if u[1] == "link"][: args.show]:
        print(f"\n[{rule}] {key}\n  A: {a.listing.title!r} {a.listing.url}\n     {a.listing.summary[:160]!r}"
              f"\n  B: {b.listing.title!r} {b.listing.url}\n     {b.listing.summary[:160]!r}")

    within = list(near_pairs_within_feeds(entries))
    compared = sum(n * (n - 1) // 2 for n in collections.Counter(
        e.source for e in entries if e.marks.fingerprint is not None).values())
    for a, b in within[: args.show]:
        print(f"\n[within one feed] {a.key} | {b.key}\n  A: {a.listing.title!r}\n     {a.listing.summary[:160]!r}"
              f"\n  B: {b.listing.title!r}\n     {b.listing.summary[:160]!r}")

    rng = random.Random(args.seed)
    eligible = [e for e in entries if e.marks.fingerprint is not None and e.listing.url]  # copies keep a link
    sample = rng.sample(eligible, min(args.made, len(eligible)))
    found: collections.Counter[str] = collections.Counter()
    for name, copy in COPIES.items():
        for e in sample:
            title, summary, url = copy(e.listing.title, e.listing.summary, e.listing.url, rng)
            # The outlet is a source with items of its own: half the time one of the
            # sample's feeds that has a boilerplate, which wraps the copy in its template
            # (its runs, after the story) and leaves it out of the copy's fingerprint.
            outlet = rng.choice(outlets) if outlets and rng.random() < 0.5 else boilerplate.NONE
            template = " ".join(run.strip() for run in outlet)
            made = Entry(-1, -1, "made", "copy", normalise(
                {"title": title, "summary": f"{summary} {template}".strip(), "url": url}),
                boilerplate.NONE if args.whole else outlet)
            if stories.same_story(made.story, e.story):
                found[name] += 1

    print("\nflagged natural pairs, by rule and label:")
    for (rule, label), n in sorted(tally.items()):
        print(f"  {rule:5} {label:11} {n:6,}")
    print(f"items of one feed (two stories) the text rule would join: {len(within):,} of {compared:,} pairs")
    print(f"\nrecall of made copies ({len(sample)} listings each, distance <= {stories.MAX_DISTANCE}):")
    for name in COPIES:
        print(f"  {name:50} {found[name] / len(sample):6.1%}")

    # The text rule (SimHash) is the judgement; the link rule is exact by construction.
    text_made = sum(n for name, n in found.items() if "another link" in name)
    text_true = tally[("text", "same")] + text_made
    text_false = tally[("text", "different")] + len(within)
    print(f"\nprecision of the text rule: {text_true:,} true / {text_true + text_false:,} joined"
          f" = {text_true / max(1, text_true + text_false):.4f}"
          f" (natural copies {tally[('text', 'same')]:,}, made copies {text_made:,};"
          f" false: {text_false:,}, unlabelled {tally[('text', 'unlabelled')]:,})")
    link_true = tally[("link", "same")] + found["same text, link with utm_* tags"]
    print(f"link rule: {link_true:,} labelled true, {tally[('link', 'different')]:,} labelled false,"
          f" {tally[('link', 'unlabelled')]:,} unlabelled (one link, other texts)")

if __name__ == "__main__":
    main()
