"""The ``sbx`` command line."""
