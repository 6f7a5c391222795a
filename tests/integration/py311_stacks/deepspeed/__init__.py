"""Test double: see ../README.md."""
__version__ = "0.16.4"
