"""The sizing suite (``shardlab compare --suite sizing``): models x SLO levels x rates,
each sized over GPU types and serving modes, side by side with AIConfigurator's
``--target-request-rate`` answers where it has them.

Each (model, SLO level) is one curve over the suite's rates (instance capacities
solved once per curve); every rate reports the cheapest deployment, each GPU type's
own, and, per type, aggregated and disaggregated apart (the comparison with
AIConfigurator, which sizes one type and one mode at a time).
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from shardlab.errors import ShardlabError
from shardlab.files import make_dir, markdown_table, write_text
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.sizing.deployment import Deployment
from shardlab.sizing.size import Sizer, sizing_cluster


@dataclass(frozen=True, kw_only=True)
class SizingCase:
    name: str  # model key / SLO level
    model: str
    input_len: int
    output_len: int
    ttft_ms: float
    tpot_ms: float
    aiconfigurator: str  # the model's path in AIConfigurator's answers ("" : none)


@dataclass(frozen=True, kw_only=True)
class SizingSuite:
    gpus: tuple[str, ...]
    engine: str
    space: str
    rates: tuple[float, ...]
    max_gpus: int
    cases: tuple[SizingCase, ...]


def load_suite() -> SizingSuite:
    """The suite shipped in ``shardlab/problems/data/sizing.yaml``."""
    text = (resources.files("shardlab.problems") / "data" / "sizing.yaml").read_text()
    raw = yaml.safe_load(text)
    cases = []
    for key, m in raw["models"].items():
        for level, slo in raw["slo_levels"].items():
            cases.append(
                SizingCase(
                    name=f"{key}/{level}",
                    model=m["model"],
                    input_len=m["input_len"],
                    output_len=m["output_len"],
                    ttft_ms=float(slo["ttft_ms"]),
                    tpot_ms=float(slo["tpot_ms"]),
                    aiconfigurator=m.get("aiconfigurator", ""),
                )
            )
    return SizingSuite(
        gpus=tuple(raw["gpus"]),
        engine=raw["engine"],
        space=raw["space"],
        rates=tuple(float(r) for r in raw["rates"]),
        max_gpus=int(raw["max_gpus"]),
        cases=tuple(cases),
    )


def _problem(suite: SizingSuite, case: SizingCase) -> Problem:
    accs = builtin_accelerators()
    return Problem.build(
        case.model,
        sizing_cluster({g: accs[g] for g in suite.gpus}, suite.max_gpus),
        "chat",
        engine=suite.engine,  # type: ignore[arg-type]
        space_kind=suite.space,  # type: ignore[arg-type]
        input_len=case.input_len,
        output_len=case.output_len,
        ttft_ms=case.ttft_ms,
        tpot_ms=case.tpot_ms,
        rate=suite.rates[0],
    )


def _gpus(d: Deployment | None) -> int | None:
    return None if d is None else d.gpus


def run_case(suite: SizingSuite, case: SizingCase) -> list[dict[str, Any]]:
    """One curve: every rate's answers, as rows."""
    accs = builtin_accelerators()
    start = time.perf_counter()
    sizer = Sizer(
        _problem(suite, case),
        {g: accs[g] for g in suite.gpus},
        serving="best",
        max_gpus=suite.max_gpus,
    )
    curve = sizer.curve(suite.rates)
    rows = []
    for s in curve:
        row: dict[str, Any] = {
            "case": case.name,
            "model": case.model,
            "ttft_ms": case.ttft_ms,
            "tpot_ms": case.tpot_ms,
            "rate_rps": s.rate,
            "best": s.best.label() if s.best else None,
            "best_mode": s.best.mode if s.best else None,
            "best_gpus": _gpus(s.best),
        }
        for g in suite.gpus:
            alone = s.by_gpu.get(g)
            row[f"{g}_gpus"] = _gpus(alone)
            row[f"{g}_mode"] = alone.mode if alone else None
            if not s.carried:
                for mode in ("agg", "disagg"):
                    d = sizer.agg(s.rate, [g]) if mode == "agg" else sizer.disagg(s.rate, [g], [g])
                    row[f"{g}_{mode}_gpus"] = _gpus(d)
                    row[f"{g}_{mode}"] = d.label() if d else None
        rows.append(row)
    for row in rows:
        row["curve_solves"] = sizer.caps.solves
        row["curve_seconds"] = round(time.perf_counter() - start, 1)
    return rows


def aiconfigurator_answers(path: Path) -> dict[tuple[str, str, str, float], dict[str, str]]:
    """AIConfigurator's answers (``tests/data/aiconfigurator_sizing.csv``) by (model
    path, GPU, mode, rate)."""
    gpu_of = {"h100_sxm": "h100", "h200_sxm": "h200", "b200_sxm": "b200"}
    out = {}
    with path.open() as f:
        for r in csv.DictReader(f):
            key = (r["model"], gpu_of.get(r["system"], r["system"]), r["serving"])
            out[(*key, float(r["target_rate_rps"]))] = r
    return out


def run_suite(
    out_dir: Path,
    command: str,
    aiconfigurator: Path | None,
    on_case: Callable[[str, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every case of the suite (``on_case``: told of each as it ends); ``summary.md``
    and ``results.json`` in ``out_dir``."""
    suite = load_suite()
    rows: list[dict[str, Any]] = []
    for case in suite.cases:
        done = run_case(suite, case)
        if on_case is not None:
            on_case(case.name, done)
        rows += done
    make_dir(out_dir)
    write_text(out_dir / "results.json", json.dumps(rows, indent=2) + "\n")
    aic = aiconfigurator_answers(aiconfigurator) if aiconfigurator is not None else {}
    write_text(out_dir / "summary.md", summary_markdown(suite, rows, command, aic))
    return rows


def _cell(gpus: int | None, mode: str | None = None) -> str:
    if gpus is None:
        return "none"
    return f"{gpus}" + (f" {mode}" if mode else "")


def summary_markdown(
    suite: SizingSuite,
    rows: list[dict[str, Any]],
    command: str,
    aic: dict[tuple[str, str, str, float], dict[str, str]],
) -> str:
    lines = [
        "# Sizing suite: fewest GPUs serving a rate under the SLOs",
        "",
        f"Produced by `{command}`; do not edit by hand. {suite.engine} ({suite.space} "
        f"space), GPU types {', '.join(suite.gpus)}, up to {suite.max_gpus} GPUs, serving "
        "agg or disagg (the cheaper chosen); every answer proven optimal under the cost "
        "model (`shardlab.sizing.size`). 'none': no deployment up to the limit.",
        "",
    ]
    head = ["case", "TTFT/TPOT ms", "requests/s", "cheapest", "GPUs"]
    head += [*(f"{g} only" for g in suite.gpus), "curve solves", "curve s"]
    lines += markdown_table(
        head,
        "llrlr" + "r" * len(suite.gpus) + "rr",
        (
            [
                r["case"],
                f"{r['ttft_ms']:g}/{r['tpot_ms']:g}",
                f"{r['rate_rps']:g}",
                r["best"] or "none",
                _cell(r["best_gpus"]),
                *(_cell(r[f"{g}_gpus"], r[f"{g}_mode"]) for g in suite.gpus),
                r["curve_solves"],
                r["curve_seconds"],
            ]
            for r in rows
        ),
    )
    if aic:
        lines += [
            "",
            "## Side by side with AIConfigurator 0.12's `--target-request-rate`",
            "",
            "GPUs each needs for one GPU type and one serving mode (AIConfigurator: "
            "`tests/data/aiconfigurator_sizing.csv`, the command that made it in "
            "`tests/data/make_aiconfigurator_sizing.py`; SILICON database, trtllm, one "
            "replica configuration times the replicas the rate needs, each replica's rate "
            "its closed-loop concurrency / latency; shardlab: a proven optimum over "
            "instance mixes and plans, same model of the load).",
            "",
        ]
        cases = {c.name: c for c in suite.cases}
        body: list[list[object]] = []
        for r in rows:
            case = cases[r["case"]]
            for g in suite.gpus:
                for mode in ("agg", "disagg"):
                    a = aic.get((case.aiconfigurator, g, mode, r["rate_rps"]))
                    if a is None or (case.ttft_ms, case.tpot_ms) != (
                        float(a["ttft_ms"]),
                        float(a["tpot_ms"]),
                    ):
                        continue
                    theirs = a["gpus_needed"] or "none"
                    replica = _replica(a) if a["gpus_needed"] else a["error"]
                    body.append(
                        [
                            case.model,
                            f"{r['rate_rps']:g}",
                            g,
                            mode,
                            theirs,
                            replica,
                            _cell(r.get(f"{g}_{mode}_gpus")),
                            r.get(f"{g}_{mode}") or "none",
                        ]
                    )
        head = ["model", "rate", "GPU", "mode", "AIConfigurator GPUs", "its replica"]
        head += ["shardlab GPUs", "shardlab deployment"]
        lines += markdown_table(head, "lrllrlrl", body)
    return "\n".join(lines) + "\n"


def _replica(a: dict[str, str]) -> str:
    if a["serving"] == "agg":
        return (
            f"{a['replicas']} x {a['gpus_per_replica']} GPUs (tp {a['tp']} pp {a['pp']} "
            f"dp {a['dp']}, moe tp {a['moe_tp']} ep {a['moe_ep']}; batch {a['bs']})"
        )
    return (
        f"{a['replicas']} x ({a['prefill_workers']}P tp{a['prefill_tp']} + "
        f"{a['decode_workers']}D tp{a['decode_tp']})"
    )


def check_suite_options(**given: object) -> None:
    """``compare --suite sizing`` takes its problems from the suite: refuse options
    that would be ignored."""
    taken = [k for k, v in given.items() if v]
    if taken:
        raise ShardlabError(
            f"the sizing suite sizes its own problems; it takes no {', '.join(taken)}",
            field="suite",
            fix="drop them, or run `shardlab size` for one problem",
        )
