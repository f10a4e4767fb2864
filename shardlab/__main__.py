"""``shardlab`` and ``python -m shardlab``: the command line, Ctrl-C safe from the start.

The command line's modules take a second or two to load (numpy, OR-Tools, typer);
an interrupt then must end the command as one in a command does, not as a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from shardlab.cli import main as cli_main
    except (KeyboardInterrupt, ImportError) as exc:
        from shardlab.errors import interrupted

        if not interrupted(exc):
            raise
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
