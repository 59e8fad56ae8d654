"""The offline demo: a local site with feeds that grow, and a webhook receiver to watch.

``python3 dev.py up`` runs ``pipeline demo serve`` beside the Dagster UI and seeds the
database with ``pipeline demo seed``: four sources on this site (an RSS job board, an
Atom news feed, an HTML events page read with CSS selectors, its ticket prices rising
as events age, and a YouTube-style channel read by the youtube adapter), and a user
"demo" whose filters match some of what they publish (one of them watching for
changes: a price rise is a change alert), delivered by signed webhook back to this
site. Its home page lists the deliveries it received, with their signatures checked.

Content is a function of the clock: item k of a feed appears at a moment drawn once in
the k-th period after EPOCH, so the feeds gain items while the demo runs (off any beat),
and a restart carries on where it left off.
Nothing here reaches beyond 127.0.0.1.
"""
