"""Interfaces: the HTTP client, the daemon, the MCP server and the CLI."""
