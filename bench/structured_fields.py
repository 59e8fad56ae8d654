"""How often a listing's fields are read right from pages with structured data, on a
labelled sample (issue 38 item 1: at least 95% of the items that carry a field).

The sample is schema.org's own examples (the vocabulary's repository,
``data/releases/<version>/schemaorg-all-examples.txt``): each example marks up one page
of a product, an offer, an event, a job, a flat or a car in JSON-LD and in microdata.
Each (example, syntax) is one page, read as a page source without selectors reads it
(pipeline/fetching/page.py ``parse_page``, then the normaliser); its fields are compared
with hand labels of what a reader of the page sees (bench/structured_fields_labels.json,
which says how they were made). Examples labelled ``{}`` carry no field: a field read
from them is counted as false.

    git clone https://github.com/schemaorg/schemaorg /tmp/schemaorg
    .venv/bin/python bench/structured_fields.py \\
        --examples /tmp/schemaorg/data/releases/30.0/schemaorg-all-examples.txt

It also prints the CPU a page takes, beside ``extruct`` reading all of its syntaxes (the
library's default) from the same page: the peer a reader of structured data would use.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit
from bench.scratch import load as load_average
from pipeline.core.fields import Fields
from pipeline.core.words import words
from pipeline.fetching.page import parse_page
from pipeline.listings.normalize import normalise

LABELS = Path(__file__).with_name("structured_fields_labels.json")
SYNTAXES = ("JSON", "MICRODATA")
_SECTION = re.compile(r"^(PRE-MARKUP|MICRODATA|RDFA|JSON):\s*\n(.*?)(?=^(?:PRE-MARKUP|MICRODATA|RDFA|JSON):|\Z)",
                      re.MULTILINE | re.DOTALL)


def examples(path: Path) -> dict[str, dict[str, str]]:
    """Each example's sections (PRE-MARKUP, MICRODATA, RDFA, JSON) by its id (eg-0010)."""
    found = {}
    for part in re.split(r"^TYPES: ", path.read_text(encoding="utf-8"), flags=re.MULTILINE)[1:]:
        head, _, body = part.partition("\n")
        found[head.split()[0].lstrip("#")] = dict(_SECTION.findall(body))
    return found


def page(section: str) -> bytes | None:
    """The example's markup as a page; None when this syntax has none ("This example is
    in JSON-LD only")."""
    text = section.strip()
    if "<" not in text:  # "This example is in JSON-LD only", "TODO", "No Microdata"
        return None
    return f"<html><head><title>Example</title></head><body><h1>Example</h1>{text}</body></html>".encode()


def told(stored: Fields, name: str) -> str | None:
    """A field of ``stored`` as the labels write it."""
    if name == "price":
        return None if stored.price is None else f"{stored.price} {stored.currency}"
    if name == "salary":
        if stored.salary_min is None:
            return None
        return f"{stored.salary_min:f}..{stored.salary_max:f} {stored.salary_currency}"
    value = getattr(stored, name)
    return None if value is None else (f"{value:f}" if isinstance(value, Decimal) else value)


def right(name: str, label: str, found: str | None) -> bool:
    if found is None:
        return False
    if name == "location":  # the place's words a filter would name are all there
        return words(label) <= words(found)
    return found == label


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=Path, required=True, help="schemaorg-all-examples.txt")
    parser.add_argument("--repeats", type=int, default=5, help="rounds of the CPU comparison")
    args = parser.parse_args()
    import extruct

    labels = {k: v for k, v in json.loads(LABELS.read_text()).items() if not k.startswith("_")}
    every = examples(args.examples)
    missing = sorted(set(labels) - set(every))
    if missing:
        raise SystemExit(f"{args.examples} lacks the labelled examples {missing}: another release?")
    carried: dict[str, int] = {}
    correct: dict[str, int] = {}
    false: list[str] = []
    wrong: list[str] = []
    pages: list[bytes] = []
    items = [0, 0]  # pages that carry a field; of those, with every field right
    for example, labelled in labels.items():
        for syntax in SYNTAXES:
            body = page(every[example].get(syntax, ""))
            if body is None:
                continue
            wanted = {**{k: v for k, v in labelled.items() if k not in SYNTAXES}, **labelled.get(syntax, {})}
            uncarried = {k for k, v in wanted.items() if v is None}
            pages.append(body)
            [item] = parse_page(body, "http://127.0.0.1/page", {})
            stored = Fields.from_json(normalise(item.raw).fields)
            before = len(wrong)
            if any(v is not None for k, v in wanted.items() if k not in SYNTAXES):
                items[0] += 1
            for name in ("price", "salary", "area", "rooms", "location", "company"):
                found, label = told(stored, name), wanted.get(name)
                if label is None:
                    if found is not None and name not in uncarried:
                        false.append(f"{example} {syntax} {name}: {found!r}")
                    continue
                carried[name] = carried.get(name, 0) + 1
                if right(name, label, found):
                    correct[name] = correct.get(name, 0) + 1
                else:
                    wrong.append(f"{example} {syntax} {name}: {found!r}, labelled {label!r}")
            if any(v is not None for k, v in wanted.items() if k not in SYNTAXES) and len(wrong) == before:
                items[1] += 1
    print(f"commit {commit()}, load {load_average()}; {len(pages)} pages of {len(labels)} examples")
    for name, count in carried.items():
        print(f"  {name:<9} {correct.get(name, 0):>3} of {count:>3} right")
    total, good = sum(carried.values()), sum(correct.values())
    print(f"fields read right: {good} of {total} ({good / total:.1%}); items (pages) that carry a field with every"
          f" one right: {items[1]} of {items[0]} ({items[1] / items[0]:.1%}); false fields: {len(false)}")
    for line in wrong + false:
        print("  " + line)

    ours: list[float] = []
    peer: list[float] = []
    for _ in range(args.repeats):  # interleaved rounds, CPU a page
        started = time.process_time()
        for body in pages:
            parse_page(body, "http://127.0.0.1/page", {})
        ours.append((time.process_time() - started) / len(pages) * 1000)
        started = time.process_time()
        for body in pages:
            extruct.extract(body, base_url="http://127.0.0.1/page", errors="ignore")
        peer.append((time.process_time() - started) / len(pages) * 1000)
    a, b = statistics.median(ours), statistics.median(peer)
    print(f"CPU a page: parse_page with its fields {a:.2f} ms; extruct, every syntax, {b:.2f} ms;"
          f" x{a / b:.2f} (median of {args.repeats} rounds)")
    return 0 if items[0] and items[1] / items[0] >= 0.95 and not false else 1


if __name__ == "__main__":
    raise SystemExit(main())
