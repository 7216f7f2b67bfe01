"""Core: the records, errors, units and I/O primitives every room shares; imports nothing above it."""
