"""The `hinabench` command: one subcommand per job, in modules by subject.

  machine.py   sysinfo, models, bandwidth, peak        (what this machine is and can do)
  run.py       ffn, linear, suite run                  (measure points into results files)
  results.py   show, targets, figure                   (stored rows: print, judge, draw)
  numa, env    the NUMA tools and the peers' environments
  fleet.py     fleet run, status                       (a suite on every host of a Ray cluster)
  reproduce.py reproduce                               (every paper figure this machine can make)
  e2e.py       e2e                                     (whole-model prefill/decode per engine: Figs 12-14, Table 4)
Every command that prints rows takes --format (hinabench/report/render.py's renderers).
"""
from __future__ import annotations

import click

from ..errors import UserError


def ints(text: str, what: str) -> list[int]:
    """A comma-separated list of whole numbers, or a UserError that names the option."""
    try:
        vals = [int(v) for v in str(text).replace(" ", "").split(",") if v]
    except ValueError:
        raise UserError(f"{what} must be a comma-separated list of whole numbers (got '{text}')") from None
    if not vals:
        raise UserError(f"{what}: give at least one value")
    return vals


def names(v):
    """A comma-separated list of names, or None when not given."""
    return [x.strip() for x in v.split(",") if x.strip()] if v else None


def command_line() -> str:
    """The command line that reproduces this invocation (options that differ from their defaults)."""
    import shlex
    ctx = click.get_current_context()
    parts = ["hinabench"] + ctx.command_path.split()[1:]
    for p in ctx.command.params:
        v = ctx.params.get(p.name)
        if isinstance(p, click.Argument):
            parts += [str(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        elif v != p.default and v not in (None, False):
            parts += [p.opts[0]] if v is True else [p.opts[0], str(v)]
    return " ".join(shlex.quote(x) for x in parts)


def console(stderr: bool = False):
    from rich.console import Console
    return Console(stderr=stderr)


def format_option(default: str = "table", formats=None):
    """The one --format option of every command that prints rows."""
    from ..report.render import FORMATS
    return click.option("--format", "fmt", type=click.Choice(list(formats or FORMATS)), default=default,
                        show_default=True, help="How to print the rows.")


class _Group(click.Group):
    """Turns UserError into one line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx):
        from ..native import NativeMissing
        try:
            return super().invoke(ctx)
        except (UserError, NativeMissing) as e:
            click.echo(f"hinabench: error: {e}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:   # before a sweep began (a sweep says what it kept itself)
            click.echo("hinabench: interrupted: nothing was measured or written", err=True)
            ctx.exit(130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hinabench")
def cli():
    """Benchmark Mixture-of-Experts kernels on CPUs against the memory-bandwidth roofline."""


def _attach() -> None:
    # Imported here (not lazily swallowed): a broken module is an error, not a vanished command.
    from . import attn, e2e, env, fleet, machine, numa, reproduce, results, run
    for mod in (machine, run, attn, results, reproduce, e2e):
        for c in mod.COMMANDS:
            cli.add_command(c)
    cli.add_command(numa.numa)
    cli.add_command(env.env)
    cli.add_command(fleet.fleet)


_attach()


def main():
    cli(prog_name="hinabench")


if __name__ == "__main__":
    main()
