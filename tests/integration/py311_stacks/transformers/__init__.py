"""Test double: see ../README.md."""
__version__ = "4.46.0"
