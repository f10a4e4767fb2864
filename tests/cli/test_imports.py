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


def _cli_in_a_fresh_process(argv: list[str], heavy: tuple[str, ...]) -> str:
    """Run ``shardlab ARGV`` in a new interpreter; fail if it exits non-zero or has
    imported any of ``heavy``. Its standard output."""
    code = (
        "import sys\n"
        "from shardlab.cli import main\n"
        f"sys.argv = ['shardlab', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"loaded = [m for m in {heavy!r} if m in sys.modules]\n"
        "sys.exit(f'imported {loaded}' if loaded else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_solve_cpsat_does_not_import_torch() -> None:
    argv = ["solve", "--method", "cpsat", "--model", "llama-3.1-8b", "--cluster", "h100x2"]
    stdout = _cli_in_a_fresh_process([*argv, "--format", "json"], ("torch",))
    assert '"status": "optimal"' in stdout


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
    stdout = _cli_in_a_fresh_process(["solve", "--help"], ("torch", "optuna", "ortools"))
    assert "--sampler" in stdout and "--proposal" in stdout
