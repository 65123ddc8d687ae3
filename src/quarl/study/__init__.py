"""Studies: grids of (agent, precision, seed) cells in a SQLite store, and their reports."""
