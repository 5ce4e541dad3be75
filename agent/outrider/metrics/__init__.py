"""Metric definitions (the catalog), sweep families, and exposition formats."""
