"""What operators manage: sources (specs, import, refresh), users and their filters,
and feed discovery.
"""
