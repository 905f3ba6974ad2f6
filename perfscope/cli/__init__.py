"""The ``perfscope`` command: a click group whose subcommands each call one library function.

``main()`` maps every :class:`perfscope.errors.PerfscopeError` (and click's usage errors) to
one line on stderr and the error's exit code; no traceback reaches the user unless
``PERFSCOPE_DEBUG=1`` is set.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING

import click

from perfscope._version import __version__
from perfscope.errors import PerfscopeError
from perfscope.format import terminal_text

if TYPE_CHECKING:
    from collections.abc import Sequence

# (module, command attribute): one module per subcommand.
COMMANDS: tuple[tuple[str, str], ...] = (
    ("perfscope.cli.profile", "profile"),
    ("perfscope.cli.analyze", "analyze"),
    ("perfscope.cli.report", "report"),
    ("perfscope.cli.devices", "devices"),
    ("perfscope.cli.import_", "import_"),
    ("perfscope.cli.sweep", "sweep"),
    ("perfscope.cli.loadtest", "loadtest"),
    ("perfscope.cli.serve", "serve"),
    ("perfscope.cli.doctor", "doctor"),
    ("perfscope.cli.generate", "generate"),
    ("perfscope.cli.compare", "compare"),
    ("perfscope.cli.dashboard", "dashboard"),
    ("perfscope.cli.export", "export"),
    ("perfscope.cli.whatif", "whatif"),
    ("perfscope.cli.capacity", "capacity"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="perfscope")
def cli() -> None:
    """Profile LLM inference and see what bounds each kernel (roofline analysis)."""


for _module, _attr in COMMANDS:
    cli.add_command(getattr(importlib.import_module(_module), _attr))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return the exit status (never raises for expected errors)."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="perfscope",
                 standalone_mode=False)
    except PerfscopeError as exc:
        if os.environ.get("PERFSCOPE_DEBUG"):
            raise
        click.echo(terminal_text(f"perfscope: error: {exc}"), err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("perfscope: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"perfscope: error: {exc.format_message()} (see `perfscope --help`)", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("perfscope: interrupted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except OSError as exc:  # a file or folder the library did not map (it maps its outputs: OutputWriteError)
        if os.environ.get("PERFSCOPE_DEBUG"):
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(terminal_text(f"perfscope: error: {where}{exc.strerror or exc} (check the path, its permissions and the free "
                   "disk space)"), err=True)
        return 5
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
