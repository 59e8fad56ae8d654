"""Listings matched to users' filters and delivered: the matcher, the delivery channels,
and the notifier stage.
"""
