"""Backends that ship with core."""
