"""Batch tuning jobs: a model's dispatches or a list of modules, each item one ordinary tiling
decision, run by workers (procrastinate on PostgreSQL, the embedded runner on SQLite)."""
