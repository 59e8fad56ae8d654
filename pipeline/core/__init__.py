"""The pure rules: settings, the error hierarchy, failure codes, backoff, URL and input rules.

Nothing here imports the rest of the pipeline, a database or the network.
"""
