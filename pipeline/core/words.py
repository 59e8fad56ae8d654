"""What a whole word is, for filters and the texts they match: one definition, used by the filter language and the matcher alike."""

from __future__ import annotations

import re
import unicodedata

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


def word_string(title: str, summary: str) -> str:
    """What ``listings.words`` stores: the listing's words (``words`` of its title and
    summary), sorted, each between spaces (" node node.js python "), so that SQL finds a
    listing holding a word by ``LIKE '% python %'`` and Python by ``" python " in it``,
    without reading the text into words again (``pipeline filters test``)."""
    return f" {' '.join(sorted(words(listing_text(title, summary))))} "
