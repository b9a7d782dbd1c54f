"""Berth's Python client (being written)."""
