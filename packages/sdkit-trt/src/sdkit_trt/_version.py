"""The one version every first-party sdkit distribution shares."""

__version__ = "3.0.0.dev0"
