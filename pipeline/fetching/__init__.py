"""Sources fetched: the adapter protocol and its adapters, politeness per host, the collector.

The collector claims due sources, fetches each through its adapter and stores what it yields.
"""
