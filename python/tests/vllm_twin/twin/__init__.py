"""The twin engine (see the package docstring)."""
