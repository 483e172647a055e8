"""User errors: the CLI prints these as one line and exits 2, without a traceback.

The one error convention of the project. `UserError` is a click.ClickException where click is
installed (the harness), so a command group invoked on its own (tests, `hinabench numa`) also prints
one line and exits 2; in a peer's worker environment, which need not have click, it is a plain
Exception.
"""
try:
    from click import ClickException as _Base
except ImportError:  # a peer's environment: the worker never prints these itself
    _Base = Exception


class UserError(_Base):
    """Bad input from the user (unknown model, impossible shape, too much memory, ...)."""
    exit_code = 2

    def __init__(self, message: str = ""):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def writable_folder(path, what: str = "--out"):
    """`path` as a folder that exists (made with its parents), or a UserError naming `what` and why not."""
    from pathlib import Path
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UserError(f"{what} {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what} {out} cannot be written: {e.strerror or e}") from None
    return out
