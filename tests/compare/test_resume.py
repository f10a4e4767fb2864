"""A comparison survives being stopped: finished runs are on disk as they finish, a
re-run runs only the missing ones, and no worker outlives its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from shardlab.compare import run_comparison
from shardlab.compare.journal import JOURNAL, Journal
from shardlab.errors import ShardlabError
from shardlab.problems.suite import get_suite

# 13 runs (random and anneal, 6 seeds each, and megatron) of about a second each
COMPARE = [
    sys.executable,
    "-m",
    "shardlab.cli",
    "compare",
    "--suite",
    "llama8b-h100x2-chat",
    "--methods",
    "random,anneal",
    "--seeds",
    "6",
    "--max-evals",
    "3000",
    "--jobs",
    "2",
    "--name",
    "stopped",
]
TOTAL = 13


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _stop_after(tmp_path: Path, finished: int, how: signal.Signals) -> tuple[int, list[int]]:
    """Start the comparison, stop it with ``how`` once ``finished`` runs are on disk;
    (its exit code, its worker pids)."""
    journal = tmp_path / "stopped" / JOURNAL
    proc = subprocess.Popen(
        [*COMPARE, "--results-dir", str(tmp_path)],
        start_new_session=True,
        # a shell's background job ignores Ctrl-C; a terminal's foreground one does not
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while len(_lines(journal)) < finished:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    workers = _children(proc.pid)
    if how == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends the terminal's group
    else:
        proc.send_signal(how)
    code = proc.wait(timeout=120)
    for _ in range(100):
        if not any(_alive(w) for w in workers):
            break
        time.sleep(0.1)
    return code, workers


# 20-32 s each on 2 cores (a comparison started, stopped and resumed in processes)
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_a_stopped_comparison_resumes_without_repeating_or_losing_a_run(
    tmp_path: Path, how: signal.Signals
) -> None:
    journal = tmp_path / "stopped" / JOURNAL
    code, workers = _stop_after(tmp_path, 3, how)
    assert code == (-signal.SIGKILL if how == signal.SIGKILL else 130)
    assert len(workers) == 2
    assert not [w for w in workers if _alive(w)], "workers outlived the comparison"
    before = _lines(journal)
    assert 3 <= len(before) < TOTAL
    assert not (tmp_path / "stopped" / "results.json").exists()  # nothing half-written

    again = subprocess.run(
        [*COMPARE, "--results-dir", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert again.returncode == 0, again.stderr
    assert f"{len(before)} of {TOTAL} runs finished before" in again.stderr
    after = _lines(journal)
    assert after[: len(before)] == before  # the finished runs are kept as they were
    keys = [json.loads(line)["key"] for line in after]
    assert len(keys) == len(set(keys)) == TOTAL  # none repeated, none lost
    ran_again = [line for line in again.stderr.splitlines() if line.strip().startswith("[")]
    assert len(ran_again) == TOTAL - len(before)
    runs = json.loads((tmp_path / "stopped" / "results.json").read_text())["runs"]
    assert len(runs) == TOTAL
    assert {task_key_of(r) for r in runs} == {task_key_of(json.loads(x)["run"]) for x in after}


def task_key_of(run: dict[str, Any]) -> tuple:
    return (run["instance"], run["method"], run["seed"], run["task_max_evals"])


def test_a_torn_last_line_is_dropped_and_a_bad_one_refused(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL
    journal = Journal(path)
    journal.add("a", {"x": 1})
    journal.add("b", {"x": 2})
    with path.open("a") as fh:
        fh.write('{"key": "c", "run": {"x"')  # killed while writing
    again = Journal(path)
    assert set(again) == {"a", "b"} and again.runs["b"] == {"x": 2}
    assert len(_lines(path)) == 2
    path.write_text(path.read_text().rstrip("\n"))  # a whole record, killed before "\n"
    Journal(path).add("c", {"x": 3})
    assert Journal(path).runs == {"a": {"x": 1}, "b": {"x": 2}, "c": {"x": 3}}
    path.write_text('not json\n{"key": "a", "run": {}}\n')
    with pytest.raises(ShardlabError, match="line 1 is not a finished run"):
        Journal(path)


def test_a_run_that_failed_is_run_again(tmp_path: Path) -> None:
    inst = get_suite("llama70b-h100x4-chat")
    path = tmp_path / JOURNAL
    run_comparison(inst, ["random"], 1, max_evals=50, seconds=None, jobs=1, journal=Journal(path))
    lines = _lines(path)
    entry = json.loads(lines[0])
    entry["run"]["status"] = "error"
    path.write_text("\n".join([json.dumps(entry), *lines[1:]]) + "\n")
    seen: list[dict] = []
    again = run_comparison(
        inst, ["random"], 1, max_evals=50, seconds=None, jobs=1, journal=Journal(path),
        on_done=seen.append,
    )  # fmt: skip
    assert [(r["method"], r["seed"]) for r in seen] == [("random", 0)]
    rerun = Journal(path).runs[entry["key"]]
    assert again[0]["status"] != "error" and again[0] == {**rerun, "key": entry["key"]}


def test_runs_in_the_journal_are_not_run_again(tmp_path: Path) -> None:
    inst = get_suite("llama70b-h100x4-chat")
    journal = Journal(tmp_path / JOURNAL)
    first = run_comparison(
        inst, ["random"], 2, max_evals=100, seconds=None, jobs=1, journal=journal
    )
    seen: list[dict] = []
    heard: list[tuple[int, int]] = []
    again = run_comparison(
        inst,
        ["random"],
        3,  # one seed more: only it runs
        max_evals=100,
        seconds=None,
        jobs=1,
        journal=Journal(tmp_path / JOURNAL),
        on_done=seen.append,
        on_resume=lambda reused, total: heard.append((reused, total)),
    )
    assert heard == [(3, 4)]
    assert [(r["method"], r["seed"]) for r in seen] == [("random", 2)]
    assert again[:2] == first[:2] and again[-1] == first[-1]  # random 0, 1; megatron


class _FakeRay(types.ModuleType):
    """The part of Ray's API the executor uses, run in this process: the executor's
    own logic (one task per run, completion order, cancelling on the way out) is
    tested without a cluster; tests/compare/test_resume.py::test_real_ray runs the real one."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.inits: list[str | None] = []
        self.cancelled: list[int] = []
        self.results: list[Any] = []

    def init(self, address: str | None = None, **_: Any) -> None:
        if address == "nowhere:1":
            raise ConnectionError("no cluster")
        self.inits.append(address)

    def remote(self, **resources: Any):
        assert resources == {"num_cpus": 1}
        fake = self

        def wrap(fn):
            class Remote:
                @staticmethod
                def remote(task: Any) -> int:
                    fake.results.append(fn(task))
                    return len(fake.results) - 1

            return Remote

        return wrap

    def wait(self, refs: list[int], num_returns: int = 1) -> tuple[list[int], list[int]]:
        done = sorted(refs, reverse=True)[:num_returns]  # the last submitted finishes first
        return done, [r for r in refs if r not in done]

    def get(self, ref: int) -> Any:
        return self.results[ref]

    def cancel(self, ref: int, force: bool = False) -> None:
        self.cancelled.append(ref)


def test_runs_go_to_ray_as_one_task_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    inst = get_suite("llama70b-h100x4-chat")
    seen: list[dict] = []
    results = run_comparison(
        inst,
        ["random"],
        2,
        max_evals=100,
        seconds=None,
        jobs=1,
        journal=Journal(tmp_path / JOURNAL),
        executor="ray",
        address="head:6379",
        on_done=seen.append,
    )
    assert fake.inits == ["head:6379"]
    assert [(r["method"], r["seed"]) for r in seen] == [
        ("megatron", 0),
        ("random", 1),
        ("random", 0),
    ]
    assert [(r["method"], r["seed"]) for r in results] == [
        ("random", 0),
        ("random", 1),
        ("megatron", 0),
    ]
    local = run_comparison(inst, ["random"], 2, max_evals=100, seconds=None, jobs=1)
    assert [r["objective"] for r in results] == [r["objective"] for r in local]
    with pytest.raises(ShardlabError, match="cannot join a Ray cluster at nowhere:1") as caught:
        run_comparison(
            inst,
            ["random"],
            1,
            max_evals=10,
            seconds=None,
            jobs=1,
            executor="ray",
            address="nowhere:1",
        )
    assert caught.value.field == "address"


def test_local_runs_refuse_an_address() -> None:
    inst = get_suite("llama70b-h100x4-chat")
    with pytest.raises(ShardlabError, match="an address is the Ray cluster's") as caught:
        run_comparison(inst, ["random"], 1, max_evals=10, seconds=None, jobs=1, address="x:1")
    assert caught.value.field == "address"  # the CLI names its flag


@pytest.mark.skipif(
    not os.environ.get("SHARDLAB_RAY_ADDRESS") and not os.environ.get("SHARDLAB_CI"),
    reason="set SHARDLAB_RAY_ADDRESS to a Ray cluster's address (ray start --head)",
)
def test_real_ray(tmp_path: Path) -> None:
    # .ci/run starts a Ray head and sets SHARDLAB_CI: there the test runs, never skips
    assert os.environ.get("SHARDLAB_RAY_ADDRESS"), "CI sets SHARDLAB_RAY_ADDRESS (.ci/run)"
    inst = get_suite("llama70b-h100x4-chat")
    results = run_comparison(
        inst,
        ["random", "anneal"],
        2,
        max_evals=200,
        seconds=None,
        jobs=1,
        journal=Journal(tmp_path / JOURNAL),
        executor="ray",
        address=os.environ["SHARDLAB_RAY_ADDRESS"],
    )
    local = run_comparison(inst, ["random", "anneal"], 2, max_evals=200, seconds=None, jobs=1)
    assert [r["objective"] for r in results] == [r["objective"] for r in local]
    assert len(Journal(tmp_path / JOURNAL).runs) == len(results) == 5


def _compare(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch) -> str:
    from shardlab.cli import main

    monkeypatch.setattr(sys, "argv", ["shardlab", "compare", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 0, err
    return err


def test_a_committed_comparison_is_extended_without_its_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    """A clone has results.json but not runs.jsonl: more seeds run only the new seed
    (random runs once at the larger budget, anneal once per budget)."""
    args = ["--suite", "llama70b-h100x4-chat", "--methods", "random,anneal", "--budgets"]
    args += ["40,80", "--jobs", "1", "--name", "c", "--results-dir", str(tmp_path)]
    _compare([*args, "--seeds", "1"], capsys, monkeypatch)
    out = tmp_path / "c"
    first = json.loads((out / "results.json").read_text())["runs"]
    assert len({r["key"] for r in first}) == 4  # random, anneal at 40 and 80, megatron
    (out / JOURNAL).unlink()

    err = _compare([*args, "--seeds", "2"], capsys, monkeypatch)
    assert f"started from {out / 'results.json'} (4 runs)" in err
    ran = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("  [")]
    assert sorted(ran) == [
        "llama70b-h100x4-chat anneal seed 1: feasible",
        "llama70b-h100x4-chat anneal seed 1: feasible",
        "llama70b-h100x4-chat random seed 1: feasible",
    ]
    again = json.loads((out / "results.json").read_text())["runs"]
    assert [r for r in again if r["seed"] == 0] == first
    assert len(Journal(out / JOURNAL).runs) == 7


def test_records_without_their_key_start_no_journal(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [{"status": "feasible", "wall_s": 1.0}]}))
    journal = Journal(tmp_path / JOURNAL)
    assert journal.start_from(results) == 0 and not journal.runs
    results.write_text("[1, 2]")
    with pytest.raises(ShardlabError, match=r"not a comparison's results\.json"):
        journal.start_from(results)
