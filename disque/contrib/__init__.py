"""Integrations with other Python libraries (optional dependencies)."""
