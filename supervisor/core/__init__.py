"""Pure core: contracts, policies and the sans-I/O logic. Imports nothing above itself."""
