"""The ``sdkit`` command line."""
