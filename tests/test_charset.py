"""Feeds read in the encoding they are really in when the declared one is missing or
wrong (issue 11: once stored as windows-1252 mojibake)."""

from __future__ import annotations

import pytest

from pipeline.fetching.rss import parse_feed

TITLE = {
    "euc-jp": "東京のソフトウェアエンジニア募集",
    "koi8-r": "Разработчик на Python в Москве",
    "windows-1251": "Разработчик на Python в Москве",
    "gb2312": "北京软件工程师招聘",
    "iso-8859-1": "Café crème, déjà vu à Genève",
    "windows-1252": "Enfermeira de Chávez alega “perseguição” em Corte espanhola",
    "utf-8": "Grüße aus Köln — ✓",
}
SUMMARY = {
    "euc-jp": "経験者歓迎、リモート可能です。詳細は面接にて。",
    "koi8-r": "Удалённая работа, полный день, опыт от трёх лет.",
    "windows-1251": "Удалённая работа, полный день, опыт от трёх лет.",
    "gb2312": "欢迎有经验者，可远程工作，待遇面议。",
    "iso-8859-1": "Un poste à temps plein, près du lac, très agréable.",
    "windows-1252": "Acordo adicional da Argentina com FMI está perto de acontecer; a liderança segue.",
    "utf-8": "Straße, Übung, Größe: schön.",
}


def document(encoding: str, declaration: str = "") -> bytes:
    head = f"<?xml version='1.0'{declaration}?>"
    return (f"{head}<rss version='2.0'><channel><title>t</title><item><guid>1</guid><title>{TITLE[encoding]}</title>"
            f"<description>{SUMMARY[encoding]}</description></item></channel></rss>").encode(encoding)


@pytest.mark.parametrize("encoding", ["euc-jp", "koi8-r", "windows-1251", "gb2312", "iso-8859-1", "windows-1252"])
@pytest.mark.parametrize("content_type", [None, "application/rss+xml", "text/xml"])
def test_an_undeclared_encoding_is_detected(encoding, content_type):
    """Western text without a declaration is windows-1252, the web's default for it (the
    WHATWG encoding standard's, and feedparser's fallback), which a detector would read as
    windows-1250 or -1257 ("trčs", "prisćo"); other scripts are read as what they are."""
    [item] = parse_feed(document(encoding), "http://127.0.0.1/feed", content_type)
    assert (item.raw["title"], item.raw["summary"]) == (TITLE[encoding], SUMMARY[encoding])


@pytest.mark.parametrize("encoding", ["utf-8", "koi8-r", "euc-jp"])
def test_a_wrong_single_byte_http_charset_is_seen_through(encoding):
    # A misconfigured server labels everything Latin-1.
    [item] = parse_feed(document(encoding), "http://127.0.0.1/feed", "text/plain; charset=iso-8859-1")
    assert item.raw["title"] == TITLE[encoding]


@pytest.mark.parametrize(("content_type", "declaration"), [
    ("application/rss+xml; charset=iso-8859-1", ""),
    (None, " encoding='iso-8859-1'"),
    ("text/xml; charset=windows-1252", ""),
])
def test_a_true_declared_encoding_is_believed(content_type, declaration):
    [item] = parse_feed(document("iso-8859-1", declaration), "http://127.0.0.1/feed", content_type)
    assert item.raw["title"] == TITLE["iso-8859-1"]


def test_a_declared_encoding_that_fails_is_replaced_by_what_the_bytes_are():
    body = document("koi8-r", " encoding='utf-8'")  # says UTF-8, is KOI8-R
    [item] = parse_feed(body, "http://127.0.0.1/feed", "application/rss+xml")
    assert item.raw["title"] == TITLE["koi8-r"]


@pytest.mark.parametrize("codepage", ["cp500", "cp037", "cp1140", "cp875"])
def test_an_ebcdic_feed_is_read_in_the_code_page_it_declares_and_its_entities_are_refused(codepage):
    """A feed declaring cp500, in cp500, was read by the detector as cp037 ("Hiring
    ¢remote! now|"), relabelled UTF-8, and its <!ENTITY declaration never seen."""
    from pipeline.core.errors import FetchError
    from pipeline.fetching.rss import parse_feed

    doc = (f"<?xml version='1.0' encoding='{codepage}'?><rss version='2.0'><channel>"
           "<item><guid>g</guid><title>Hiring [remote]! now</title></item></channel></rss>")
    [item] = parse_feed(doc.encode(codepage), "http://127.0.0.1/feed")
    assert item.raw["title"] == "Hiring [remote]! now"
    bomb = doc.replace("<rss", "<!DOCTYPE rss [<!ENTITY a 'aaaaaaaaaa'>]><rss").replace("now", "&a;")
    with pytest.raises(FetchError, match="declares XML entities"):
        parse_feed(bomb.encode(codepage), "http://127.0.0.1/feed")


@pytest.mark.parametrize(("bom", "codec"), [(b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"),
                                            (b"\xfe\xff", "utf-16-be")])
@pytest.mark.parametrize("content_type", ["text/plain; charset=iso-8859-1", "application/rss+xml; charset=windows-1252",
                                          "text/xml"])
def test_a_byte_order_mark_decides_the_encoding_over_a_wrong_charset(bom, codec, content_type):
    """Real UTF-8 feeds with a BOM, declaring UTF-8 and served as iso-8859-1, were stored
    with mojibake ("Jänner" as "JÃ¤nner", "£30" as "Â£30"): a BOM decides, as the
    WHATWG encoding standard's BOM sniffing does."""
    title, summary = "Jänner: £30, Привет", "<p>Größe — ✓ Jänner</p>"
    doc = (f"<?xml version='1.0' encoding='{codec.split('-le')[0].split('-be')[0]}'?><rss version='2.0'><channel>"
           f"<title>t</title><item><guid>1</guid><title>{title}</title>"
           f"<description><![CDATA[{summary}]]></description></item></channel></rss>")
    [item] = parse_feed(bom + doc.encode(codec), "http://127.0.0.1/feed", content_type)
    assert item.raw["title"] == title
    assert "Größe — ✓ Jänner" in item.raw["summary"]
