"""User errors: the CLI prints these as one line and exits non-zero, without a traceback."""


class UserError(Exception):
    """Bad input from the user (unknown model, impossible shape, too much memory, ...)."""
