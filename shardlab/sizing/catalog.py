"""The sizing curve across the whole catalog (``shardlab compare --suite catalog``,
``results/sizing/catalog.md``): for each model and rate, the cheapest deployment of
each GPU type alone and of all of them together, at example prices.

The prices are an *example input*, not catalog truth: no GPU maker publishes an
on-demand list price (``docs``: the catalog states none). Each is one public page's
figure at its date, per GPU-hour, written beside it in the results; where no page
gave one the price is a stated assumption. A user prices their own cloud with
``shardlab size --price``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.files import make_dir, markdown_table, write_text
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.datafile import load_records
from shardlab.problems.engines import VENDOR_ENGINES
from shardlab.problems.problem import Problem
from shardlab.sizing.answer import sizing_json
from shardlab.sizing.deployment import Deployment
from shardlab.sizing.size import DEFAULT_MAX_GPUS, Sizer, Sizing, sizing_cluster


@dataclass(frozen=True, kw_only=True)
class ExamplePrice:
    name: str  # the GPU's catalog key
    usd_per_gpu_hour: float
    source: str  # where the figure was read, and what it is
    date: str  # the date the page gives for it


# sourced examples, shardlab/problems/data/example_prices.yaml
EXAMPLE_PRICES: tuple[ExamplePrice, ...] = tuple(
    load_records("example_prices.yaml", ExamplePrice).values()
)


def example_prices(gpus: Sequence[str] | None = None) -> dict[str, float]:
    """$/GPU-hour of ``gpus`` (all the catalog's: None) at the example prices."""
    prices = {p.name: p.usd_per_gpu_hour for p in EXAMPLE_PRICES}
    return prices if gpus is None else {g: prices[g] for g in gpus}


@dataclass(frozen=True, kw_only=True)
class CatalogCurve:
    model: str
    rates: tuple[float, ...]
    input_len: int = 1024
    output_len: int = 256
    ttft_ms: float = 2000
    tpot_ms: float = 50


# SGLang runs on every NVIDIA and AMD GPU of the catalog (TensorRT-LLM on none of
# AMD's) and is the engine of InferenceX's AMD runs; Intel's B60 runs vLLM only.
ENGINE = "sglang"
CURVES = (
    CatalogCurve(model="llama-3.1-70b", rates=(5, 10, 20, 40, 80)),
    CatalogCurve(model="deepseek-v3", rates=(10, 25, 50, 100)),
)


def catalog_gpus() -> tuple[str, ...]:
    """Every GPU of the built-in catalog the suite's engine runs on, in its order."""
    return tuple(k for k, a in builtin_accelerators().items() if ENGINE in VENDOR_ENGINES[a.vendor])


def size_command(curve: CatalogCurve, gpus: Sequence[str]) -> str:
    """The ``shardlab size`` command that sizes one curve of the tables."""
    prices = ",".join(f"{g}={p:g}" for g, p in example_prices(gpus).items())
    return (
        f"shardlab size --model {curve.model} --rates {','.join(f'{r:g}' for r in curve.rates)} "
        f"--gpus {','.join(gpus)} --price {prices} --engine {ENGINE} --space engine "
        f"--input-len {curve.input_len} --output-len {curve.output_len} "
        f"--ttft-ms {curve.ttft_ms:g} --tpot-ms {curve.tpot_ms:g}"
    )


def size_curve(curve: CatalogCurve, gpus: Sequence[str]) -> tuple[Sizer, list[Sizing], float]:
    """The curve's answers over ``gpus`` at the example prices, and its wall seconds."""
    accs = {g: builtin_accelerators()[g] for g in gpus}
    start = time.perf_counter()
    problem = Problem.build(
        curve.model,
        sizing_cluster(accs, DEFAULT_MAX_GPUS),
        "chat",
        engine=ENGINE,
        space_kind="engine",
        input_len=curve.input_len,
        output_len=curve.output_len,
        ttft_ms=curve.ttft_ms,
        tpot_ms=curve.tpot_ms,
        rate=min(curve.rates),  # as `shardlab size --rates` offers it: the lowest
    )
    sizer = Sizer(problem, accs, prices=example_prices(gpus))
    answers = sizer.curve(curve.rates)
    return sizer, answers, time.perf_counter() - start


def _cell(d: Deployment | None) -> str:
    return "none" if d is None else f"${d.cost:,.2f} ({d.gpus})"


def curve_rows(curve: CatalogCurve, answers: Sequence[Sizing]) -> list[dict[str, Any]]:
    """One row per (rate, GPU type alone or the mix): what the CSV holds."""
    rows = []
    for s in answers:
        for gpu, d in [*s.by_gpu.items(), ("best", s.best)]:
            rows.append(
                {
                    "model": curve.model,
                    "rate_rps": s.rate,
                    "gpu": gpu,
                    "serving": None if d is None else d.mode,
                    "deployment": "none" if d is None else d.label(),
                    "usd_per_hour": None if d is None else round(d.cost, 4),
                    "gpus": None if d is None else d.gpus,
                    "usd_per_hour_per_rps": None if d is None else round(d.cost / s.rate, 4),
                }
            )
    return rows


def curve_markdown(
    curve: CatalogCurve, gpus: Sequence[str], answers: Sequence[Sizing], seconds: float
) -> list[str]:
    """One model's section: each type alone and all together, $/hour (GPUs) per rate."""
    rates = [f"{s.rate:g}/s" for s in answers]
    lines = [
        f"## {curve.model}",
        "",
        f"{curve.input_len} in / {curve.output_len} out, TTFT <= {curve.ttft_ms:g} ms, "
        f"TPOT <= {curve.tpot_ms:g} ms (means), {ENGINE}'s launchable space, serving agg "
        f"or disagg, up to {DEFAULT_MAX_GPUS} GPUs; $/hour at the example prices (GPUs). "
        f"Sized in {seconds:.0f} s, every rate.",
        "",
        f"`{size_command(curve, gpus)}`",
        "",
    ]
    body = [[g, *(_cell(s.by_gpu.get(g)) for s in answers)] for g in gpus]
    body.append(["**all types together**", *(_cell(s.best) for s in answers)])
    lines += markdown_table(["GPU", *rates], "l" + "r" * len(rates), body)
    lines += ["", "The cheapest deployment at each rate:", ""]
    lines += markdown_table(
        ["rate", "deployment", "serving", "$/hour", "GPUs", "$/hour per request/s"],
        "rllrrr",
        (
            [f"{s.rate:g}/s", s.best.label(), s.best.mode, f"${s.best.cost:,.2f}",
             s.best.gpus, f"${s.best.cost / s.rate:,.3f}"]
            if s.best is not None
            else [f"{s.rate:g}/s", "none", "-", "-", "-", "-"]
            for s in answers
        ),
    )  # fmt: skip
    return [*lines, ""]


def prices_markdown(gpus: Sequence[str]) -> list[str]:
    lines = [
        "## Example prices",
        "",
        "Example input, not catalog truth: one public page's figure per GPU at its date "
        "(no GPU maker publishes an on-demand list price). The sources differ in kind "
        "(on-demand list prices, a blended average, one assumption), so the $/hour "
        "comparison between types is only as good as these figures; price your own "
        "cloud with `shardlab size --price`.",
        "",
    ]
    chosen = [p for p in EXAMPLE_PRICES if p.name in gpus]
    lines += markdown_table(
        ["GPU", "$/GPU-hour", "date", "source"],
        "lrll",
        ([p.name, f"{p.usd_per_gpu_hour:.2f}", p.date, p.source] for p in chosen),
    )
    return [*lines, ""]


def run_catalog(
    out_dir: Path,
    command: str,
    on_case: Callable[[str, list[dict[str, Any]]], None] | None = None,
    curves: Sequence[CatalogCurve] = CURVES,
    gpus: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Size every curve over ``gpus`` (the whole catalog: None); write catalog.md,
    .csv and .json to ``out_dir``; the CSV's rows."""
    chosen = tuple(gpus) if gpus is not None else catalog_gpus()
    sections: list[str] = []
    rows: list[dict[str, Any]] = []
    answers_json: list[dict[str, Any]] = []
    for curve in curves:
        sizer, answers, seconds = size_curve(curve, chosen)
        these = curve_rows(curve, answers)
        rows += these
        sections += curve_markdown(curve, chosen, answers, seconds)
        answers_json.append(
            {"command": size_command(curve, chosen), "seconds": round(seconds, 1),
             "answer": sizing_json(sizer, answers)}
        )  # fmt: skip
        if on_case is not None:
            on_case(curve.model, [{**these[0], "curve_seconds": round(seconds, 1)}])
    head = [
        "# Sizing across the whole catalog",
        "",
        f"Every catalog GPU that {ENGINE} runs on; left out: "
        + ", ".join(k for k in builtin_accelerators() if k not in catalog_gpus())
        + f" ({ENGINE} does not run there).",
        "",
        f"Produced by `{command}`; numbers are written by the code, never by hand. Each "
        "model's curve is also one `shardlab size` command, written under its table. "
        "NVIDIA GPUs with aiconfigurator-core tables are timed by them (silicon); H100 "
        "PCIe, L4 and the AMD GPUs by the roofline (no measured kernels: see `shardlab "
        "clusters`), so their answers move when fitted efficiencies land.",
        "",
    ]
    text = "\n".join([*head, *prices_markdown(chosen), *sections])
    make_dir(out_dir)
    write_text(out_dir / "catalog.md", text)
    write_text(out_dir / "catalog.json", json.dumps(answers_json, indent=1) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["model"])
    writer.writeheader()
    writer.writerows(rows)
    write_text(out_dir / "catalog.csv", buf.getvalue())
    return rows
