from __future__ import annotations

import subprocess
import sys


def test_cli_does_not_import_torch() -> None:
    code = (
        "import sys, shardlab.cli, shardlab.problems; "
        "from shardlab import Problem; Problem.build('deepseek-v3', 'h100x64').space; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
