"""The database: schema and queues, engine and migrations, and the reads over it.

Health (queue predicates on the database clock), status for operators, upkeep (retention).
"""
