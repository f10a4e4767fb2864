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


def test_solve_cpsat_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from shardlab.cli import main\n"
        "sys.argv = ['shardlab', 'solve', '--method', 'cpsat', '--model', 'llama-3.1-8b',"
        " '--cluster', 'h100x2', '--format', 'json']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"status": "optimal"' in proc.stdout


def test_gymnasium_env_does_not_import_torch() -> None:
    code = (
        "import sys, gymnasium, shardlab.envs\n"
        "env = gymnasium.make('shardlab/Sharding-v0', instance='llama8b-h100x2-chat')\n"
        "obs, info = env.reset(seed=0)\n"
        "done = False\n"
        "while not done:\n"
        "    action = int(info['action_mask'].argmax())\n"
        "    obs, reward, done, truncated, info = env.step(action)\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_solve_help_lists_every_methods_options_without_loading_them() -> None:
    code = (
        "import sys\n"
        "from shardlab.cli import main\n"
        "sys.argv = ['shardlab', 'solve', '--help']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = [m for m in ('torch', 'optuna', 'ortools') if m in sys.modules]\n"
        "sys.exit(f'imported {heavy}' if heavy else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--sampler" in proc.stdout and "--proposal" in proc.stdout
