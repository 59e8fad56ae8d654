"""The listings pipeline: sources fetched on their own cadence, normalised, matched and notified.

The core (this package) is plain Python over SQLAlchemy Core and httpx; the Dagster
layer lives in the top-level ``assets``, ``resources`` and ``sensors`` packages.
"""
