"""The ``sandvisor`` command line."""
