"""The package version, in the bottom layer so any module may name it without importing the API."""

__version__ = "0.1.0"
