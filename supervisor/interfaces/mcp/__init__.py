"""The MCP server: one stdio connection is one session of the daemon."""
