"""CLI command modules; each exposes register(app) and stays a thin layer over the library."""
