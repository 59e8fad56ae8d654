"""The pipeline's small web services: the bounded WSGI server they share (server.py) and
the output feeds (feeds.py renders them, app.py answers for them: ``pipeline serve``)."""
