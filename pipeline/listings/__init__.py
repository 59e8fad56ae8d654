"""Raw items normalised into listings: the pure normaliser, and the processor stage
that claims raw rows and upserts listings.
"""
