"""What a whole word is, for filters and the texts they match (DESIGN.md "Filters and
delivery"): one definition, used by the filter language and the matcher alike."""

from __future__ import annotations

import re

# A word: letters and digits, joined by inner punctuation ("node.js", "e-mail"), with an
# optional tail of + or # ("c++", "c#"). A compound word also counts as each of its
# parts, as a whole-word search would find them: "node.js" contains "node" and "js".
WORD = re.compile(r"\w+(?:[.+#'-]+\w+)*[+#]*")
_PART = re.compile(r"\w+")


def words(text: str) -> set[str]:
    """The words of ``text``, case-folded; compound words also as their parts."""
    found = {word.casefold() for word in set(WORD.findall(text))}
    for word in [w for w in found if not w.isalnum()]:
        found.update(_PART.findall(word))
    return found


def phrase_tokens(text: str) -> tuple[str, ...]:
    """The words of ``text`` in order, case-folded, compounds whole: a phrase matches a
    text whose tokens hold its tokens in a row."""
    return tuple(word.casefold() for word in WORD.findall(text))


def folded(text: str) -> str:
    """A name as the filter language compares it (``category:``, ``source:``): spaces
    collapsed, case-folded."""
    return " ".join(text.split()).casefold()
