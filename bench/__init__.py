"""Benchmarks that print the performance table of design.md §7 (``python3 -m bench``)."""
