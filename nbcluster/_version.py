"""The package version, in a module of its own that every layer may import."""

__version__ = "0.1.0"
