"""What a whole word is, for filters and the texts they match: one definition, used by
the filter language and the matcher alike."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

# A word: letters and digits, joined by inner punctuation ("node.js", "e-mail"), with an
# optional tail of + or # ("c++", "c#"). A compound word also counts as each of its
# parts, as a whole-word search would find them: "node.js" contains "node" and "js".
WORD = re.compile(r"\w+(?:[.+#'-]+\w+)*[+#]*")
_PART = re.compile(r"\w+")


def normalised(text: str) -> str:
    """``text`` as words are taken from it, in listings and filters alike: format
    characters removed (a soft hyphen, a zero-width space or a word joiner inside a word
    leaves the word whole), compatibility forms folded (NFKC: full-width letters are
    letters), case-folded. Without it "sc\u00adam" slips past ``-scam`` and "Ｐｙｔｈｏｎ"
    past ``python``."""
    if text.isascii():
        return text.casefold()
    hidden = [ch for ch in set(text) if unicodedata.category(ch) == "Cf"]
    if hidden:
        text = text.translate(dict.fromkeys(map(ord, hidden)))
    # Case folding can undo a composition ("\u01f0" folds to "j" and a combining caron).
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())


def words(text: str) -> set[str]:
    """The words of ``text``, normalised; compound words also as their parts."""
    found = set(WORD.findall(normalised(text)))
    for word in [w for w in found if not w.isalnum()]:
        found.update(_PART.findall(word))
    return found


def phrase_tokens(text: str) -> tuple[str, ...]:
    """The words of ``text`` in order, normalised, compounds whole: a phrase matches a
    text whose tokens hold its tokens in a row."""
    return tuple(WORD.findall(normalised(text)))


def folded(text: str) -> str:
    """A name as the filter language compares it (``category:``, ``source:``): spaces
    collapsed, normalised."""
    return " ".join(normalised(text).split())


def listing_text(title: str, summary: str) -> str:
    """The text of a listing that words without a field are matched in."""
    return f"{title} {summary}"


# In ``listings.words``, beside the words: an author's word and a category, each behind a
# prefix no word holds (a word has no colon), a category's spaces as U+001F (a key holds
# no space).
AUTHOR_PREFIX, CATEGORY_PREFIX = "a:", "c:"
LOCATION_PREFIX, COMPANY_PREFIX = "l:", "o:"  # the words of a listing's fields (pipeline/core/fields.py)
_PREFIXES = (AUTHOR_PREFIX, CATEGORY_PREFIX, LOCATION_PREFIX, COMPANY_PREFIX)


@functools.lru_cache(maxsize=4096)  # a pure function of its text; a feed's categories repeat
def category_key(category: str) -> str:
    """A category (as ``category:`` compares it, ``folded``) as ``listings.words`` holds it."""
    return CATEGORY_PREFIX + folded(category).replace(" ", "\x1f")


def word_string(title: str, summary: str, author: str | None = None, categories: Iterable[str] = (),
                location: str | None = None, company: str | None = None) -> str:
    """What ``listings.words`` stores: the listing's keys, sorted, each between spaces
    (" a:smith c:remote node node.js python "): the words of its title and summary, its
    author's words, its categories, and its location's and company's words ("l:berlin",
    "o:acme"), so that SQL finds the listings holding a key by
    searching for " python " and Python by ``" python " in it``, without reading the
    text into words again (``pipeline filters test``). A change to ``words``, ``folded``
    or these keys needs a migration that stores them again."""
    keys = words(listing_text(title, summary))
    for prefix, text in ((AUTHOR_PREFIX, author), (LOCATION_PREFIX, location), (COMPANY_PREFIX, company)):
        if text:
            keys.update(prefix + w for w in words(text))
    keys.update(map(category_key, categories))
    return f" {' '.join(sorted(keys))} "


def stored_text_words(stored: str | None) -> set[str] | None:
    """The words of a listing's title and summary, from what ``listings.words`` stores
    (``word_string``); None for a listing stored before it had them."""
    if stored is None:
        return None
    return {k for k in stored.split() if not k.startswith(_PREFIXES)}
