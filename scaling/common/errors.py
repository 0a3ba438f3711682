"""Errors that the CLI turns into a one-line message and exit code 2."""


class UserError(ValueError):
    """Bad input from the user (config, file, option): reported in one line, exit 2."""
