"""Outrider's version: one place, imported by the package and by the agent without the hook's API."""

__version__ = "0.1.0"
