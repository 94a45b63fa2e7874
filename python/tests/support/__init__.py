"""Test helpers for the Python connectors (not part of the package)."""
