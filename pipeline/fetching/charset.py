"""Reading a feed in the encoding it is really in, when what it declares is missing or
wrong.

A byte-order mark decides the encoding, whatever the HTTP charset says (the WHATWG
encoding standard's BOM sniffing: real UTF-8 feeds with a mark are served as
``text/plain; charset=iso-8859-1``). Otherwise the declared encoding wins whenever it
decodes the document (the HTTP charset, the XML declaration: feedparser's own RFC 3023
rules then apply). Only
when nothing is declared and the bytes are not UTF-8, or the declaration fails to decode
them, does a detector (charset-normalizer) name the encoding: an EUC-JP, KOI8-R,
windows-1251 or GB2312 feed with no declaration is read as what it is, not as
windows-1252 mojibake. One mislabelling is common enough to undo on sight: a UTF-8
document labelled with a single-byte charset (``text/plain; charset=iso-8859-1`` from a
misconfigured server). Those bytes decode as Latin-1 too, but as mojibake; a real
Latin-1 document with accented letters is almost never valid UTF-8.

An EBCDIC document (its declaration ``<?xml`` in EBCDIC) is read in the code page its
declaration names, never by the detector (which takes cp500 for cp037).

A document re-read this way is handed on as UTF-8, its XML declaration and HTTP charset
saying so.
"""

from __future__ import annotations

import codecs
import re

import charset_normalizer
from feedparser.encodings import parse_content_type

# Charsets that decode any bytes at all, so decoding without error proves nothing.
_SINGLE_BYTE = {"iso-8859-1", "iso8859-1", "latin-1", "latin1", "l1", "windows-1252", "cp1252", "us-ascii", "ascii"}
_XML_ENCODING = re.compile(rb"""^(\s*<\?xml[^>]*?encoding\s*=\s*["'])([A-Za-z0-9._:-]+)(["'])""", re.IGNORECASE)


def _decodes(body: bytes, encoding: str) -> bool:
    try:
        body.decode(encoding)
    except (LookupError, UnicodeDecodeError):
        return False
    return True


# "<?xm" in EBCDIC (the XML specification's Appendix F): the declaration that follows is
# in characters every EBCDIC code page writes alike, so it is read as cp037 to find the
# code page it names.
_EBCDIC_DECLARATION = b"\x4c\x6f\xa7\x94"


def _from_ebcdic(body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
    """An EBCDIC document as UTF-8, by the code page its declaration names (cp037 when it
    names none Python knows): a detector reads cp500 as cp037 (their brackets differ),
    and what it reads must be what every later check (the entity guard) sees."""
    named = _XML_ENCODING.match(body[:200].decode("cp037", errors="replace").encode())
    encoding = "cp037"
    if named:
        try:
            encoding = codecs.lookup(named.group(2).decode()).name
        except LookupError:
            pass
    return _utf8(body.decode(encoding, errors="replace"), content_type)


# A byte-order mark and its encoding, the four-byte ones first (UTF-32 LE's starts as
# UTF-16 LE's does).
_BOM_CODECS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
               (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))


def _utf8(text: str, content_type: str | None) -> tuple[bytes, str]:
    """``text`` as UTF-8, its XML declaration and the content type saying so."""
    body = _XML_ENCODING.sub(rb"\g<1>utf-8\g<3>", text.encode("utf-8"), count=1)
    mime, _ = parse_content_type(content_type or "")
    return body, f"{mime or 'application/xml'}; charset=utf-8"


def as_read(body: bytes, content_type: str | None) -> tuple[bytes, str | None]:
    """``body`` and ``content_type``, re-encoded as UTF-8 when the declared encoding
    (if any) is not the document's; unchanged otherwise."""
    if body.startswith(_EBCDIC_DECLARATION):
        return _from_ebcdic(body, content_type)
    for bom, codec in _BOM_CODECS:
        # A byte-order mark decides, whatever the HTTP charset says (WHATWG's BOM sniff).
        if body.startswith(bom):
            return _utf8(body[len(bom):].decode(codec, errors="replace"), content_type)
    if body[:2] in (b"\x00<", b"<\x00") or body.isascii():
        return body, content_type  # UTF-16/32 without a mark says; ASCII is ASCII
    _, http_charset = parse_content_type(content_type or "")
    match = _XML_ENCODING.match(body)
    declared = [e.lower() for e in (http_charset, match.group(2).decode() if match else "") if e]
    utf8 = _decodes(body, "utf-8")
    if declared and all(_decodes(body, e) and e not in _SINGLE_BYTE for e in declared):
        return body, content_type  # what it says works
    if utf8:
        if all(e in ("utf-8", "utf8") for e in declared):
            return body, content_type
        encoding = "utf-8"  # unlabelled, or UTF-8 labelled single-byte
    else:
        best = charset_normalizer.from_bytes(body).best()
        if best is None:
            return body, content_type  # feedparser's own fallbacks then apply
        # A single-byte label on bytes that are not UTF-8 is believed, unless the
        # detector rejects reading them so outright (KOI8-R served as iso-8859-1, say).
        # A real Latin-1 text reads fine either way and keeps its label.
        if declared and all(_decodes(body, e) for e in declared) and _reads_as(body, declared[0]):
            return body, content_type
        encoding = best.encoding
        # Undeclared bytes that read as Western text are windows-1252, the web's default
        # for them (WHATWG's, feedparser's fallback): the detector, unsure between the
        # Latin code pages, may name windows-1250 or -1257 and turn "très" into "trčs".
        if encoding != "cp1252" and _reads_as(body, "cp1252"):
            encoding = "cp1252"
    return _utf8(body.decode(encoding, errors="replace"), content_type)


def _reads_as(body: bytes, encoding: str) -> bool:
    """Whether the detector accepts ``body`` read in ``encoding`` (it rejects a reading
    that is mojibake: KOI8-R or EUC-JP bytes read as windows-1252)."""
    return charset_normalizer.from_bytes(body, cp_isolation=[encoding]).best() is not None
