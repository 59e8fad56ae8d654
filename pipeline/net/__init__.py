"""The guarded HTTP client every outbound request goes through: feeds, pages, webhooks.

Address guard, a deadline over the whole exchange, size caps and bounded decompression.
"""
