"""The claim primitive every stage takes its work through, and the pool that works a claim.

Leases, fencing tokens and attempts, in one statement on PostgreSQL; bulk-write helpers.
"""
