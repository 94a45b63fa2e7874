"""Stand-in package path (see vllm/__init__.py)."""
