"""Mélange's experiment (``shardlab compare --suite melange``): the cost of each GPU
type alone against the cheapest mix, on short, long and mixed length mixes, over
Mélange's rates and TPOT SLOs.

Mélange (Griggs et al., 2024, arXiv 2404.14527; github.com/tyler-griggs/melange-release)
served Llama-2-7B on vLLM, one GPU per instance, on L4, A10G, A100-80GB and H100 at
1-32 requests/s with a TPOT SLO of 120 or 40 ms, on Chatbot Arena (short), PubMed
(long) and a blend of 80% Arena and 20% PubMed, and published its cost against each
type alone. Here the same shape, with what shardlab has:

- Llama-3.1-8B for Llama-2-7B (the catalog has no Llama-2; GQA makes its KV cache a
  quarter of Llama-2-7B's, which favours long prompts on every GPU alike);
- A100 and H100 only (no L4 or A10G in the catalog), at Mélange's prices;
- the three length mixes as histograms built from the datasets' published means
  (:func:`lognormal_buckets`: the spread is ours, not Mélange's histograms);
- each rate sized on the mean TPOT (Mélange: the largest load whose profiled TPOT meets
  the SLO), together (:class:`~shardlab.sizing.size.Sizer`: any mix of the types'
  instances behind one router in proportion to capacity) and by prompt-length bucket
  (:func:`~shardlab.sizing.buckets.curve_by_bucket`, Mélange's routing by size).

Each mix's requests are written as a trace (``arrival_s,input_len,output_len``), so
that every cell is one ``shardlab size --traffic`` command, written beside its table.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardlab.files import make_dir, markdown_table, write_text
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.problems.traffic import Arrivals, Traffic, histogram, synthetic_traffic
from shardlab.sizing.buckets import BucketSizing, curve_by_bucket
from shardlab.sizing.deployment import Deployment
from shardlab.sizing.size import Sizer, sizing_cluster

MODEL = "llama-3.1-8b"
ENGINE = "vllm"
RATES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # Mélange's figures 11-13
TPOT_MS = (120.0, 40.0)
# $/GPU-hour as Mélange priced them: A100-80GB $3.67 and A10G $1.01 in its example
# configuration (melange/config/example.json); H100 $7.52 read from its short-context
# plot at 120 ms and 1 req/s (docs/images/Arena_120-1.png), where H100 alone costs about
# 2.05x A100 alone; there Mélange's own answer costs A100 alone / 2.15 = $1.71, one A10G
# and one L4 at $0.70. Only A100 and H100 are in the catalog.
PRICES = {"a100": 3.67, "h100": 7.52}
BUCKETS = 4
REQUESTS = 2000
MAX_GPUS = 256
# English words to Llama tokens: an estimate (SentencePiece on English prose).
TOKENS_PER_WORD = 1.3
LLAMA2_CONTEXT = 4096  # the context Mélange's Llama-2-7B served: PubMed's prompts cut to it


@dataclass(frozen=True, kw_only=True)
class Mix:
    """One of Mélange's workloads as a histogram of (input, output, weight)."""

    name: str
    what: str  # where its lengths come from
    buckets: tuple[tuple[int, int, float], ...]


def lognormal_buckets(
    mean: float, sigma: float, output: int, n: int = 8, cap: int | None = None
) -> tuple[tuple[int, int, float], ...]:
    """``n`` prompt lengths of equal weight at the mid-quantiles of a log-normal of this
    ``mean`` and log-space ``sigma`` (capped at ``cap``), each with ``output`` tokens."""
    mu = math.log(mean) - sigma**2 / 2
    unit = statistics.NormalDist()
    out = []
    for i in range(n):
        x = math.exp(mu + sigma * unit.inv_cdf((i + 0.5) / n))
        tokens = max(1, round(x if cap is None else min(x, cap)))
        out.append((tokens, output, 1.0 / n))
    return tuple(out)


def mixes() -> tuple[Mix, ...]:
    """Short (Arena), long (PubMed) and mixed (80/20), as Mélange named them."""
    # LMSYS-Chat-1M (Zheng et al., 2023, table 1): 69.5 tokens per prompt, 214.5 per
    # response, on average; a chat prompt's length spreads widely (sigma 1 is ours)
    short = lognormal_buckets(69.5, 1.0, 215)
    # PubMed summarization (Cohan et al., 2018, table 1): documents of 3,016 words,
    # abstracts of 203, on average; prompts cut to Llama-2's context less the output
    out = round(203 * TOKENS_PER_WORD)
    long = lognormal_buckets(3016 * TOKENS_PER_WORD, 0.5, out, cap=LLAMA2_CONTEXT - out)
    mixed = tuple((i, o, 0.8 * w) for i, o, w in short) + tuple((i, o, 0.2 * w) for i, o, w in long)
    return (
        Mix(name="short", what="Chatbot Arena-like: mean prompt 69.5, output 215", buckets=short),
        Mix(name="long", what="PubMed-like: mean document 3,016 words, abstract 203", buckets=long),
        Mix(name="mixed", what="80% short, 20% long (Mélange's Mixed_80_20)", buckets=mixed),
    )


def mix_traffic(mix: Mix, requests: int = REQUESTS) -> Traffic:
    """The mix's requests: Poisson arrivals at 1/s (every rate rescales them)."""
    t = synthetic_traffic(
        requests=requests,
        lengths=histogram(mix.buckets),
        arrivals=Arrivals(kind="poisson", rate=1.0),
        seed=0,
    )
    return Traffic(
        input_len=t.input_len,
        output_len=t.output_len,
        arrival_s=t.arrival_s,
        arrival=t.arrival,
        source=f"melange {mix.name}",
    )


def trace_csv(traffic: Traffic) -> str:
    """The traffic in shardlab's plain CSV trace format (``read_trace`` reads it)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["arrival_s", "input_len", "output_len"])
    assert traffic.arrival_s is not None
    for a, i, o in zip(traffic.arrival_s, traffic.input_len, traffic.output_len, strict=True):
        w.writerow([f"{a:.6f}", int(i), int(o)])
    return buf.getvalue()


def mix_problem(traffic: Traffic, tpot_ms: float, gpus: Sequence[str]) -> Problem:
    """The problem ``shardlab size --traffic`` builds: the trace's mean request."""
    accs = builtin_accelerators()
    return Problem.build(
        MODEL,
        sizing_cluster({g: accs[g] for g in gpus}, MAX_GPUS),
        "chat",
        engine=ENGINE,
        space_kind="engine",
        input_len=max(1, round(float(traffic.input_len.mean()))),
        output_len=max(2, round(float(traffic.output_len.mean()))),
        tpot_ms=tpot_ms,
        rate=1.0,
    )


def _cost(d: Deployment | None) -> float | None:
    return None if d is None else d.cost


def _saving(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None:
        return None
    return 1 - ours / theirs


def size_mix(
    traffic: Traffic,
    tpot_ms: float,
    *,
    rates: Sequence[float] = RATES,
    gpus: Sequence[str] = tuple(PRICES),
    prices: dict[str, float] | None = None,
    k: int = BUCKETS,
) -> list[dict[str, Any]]:
    """One mix at one TPOT SLO over ``rates``: each type alone, the cheapest mix served
    together, by prompt-length bucket, and the savings of the cheaper of those two
    against the best and the worst type alone (Mélange's two ends), as rows."""
    prices = prices or {g: PRICES[g] for g in gpus}
    accs = builtin_accelerators()
    chosen = {g: accs[g] for g in gpus}
    problem = mix_problem(traffic, tpot_ms, gpus)

    def make(p: Problem, shaped: Traffic | None) -> Sizer:
        return Sizer(p, chosen, prices=prices, max_gpus=MAX_GPUS, traffic=shaped)

    start = time.perf_counter()
    curve: list[BucketSizing] = curve_by_bucket(problem, traffic, rates, k, make)
    seconds = time.perf_counter() - start
    rows = []
    for b in curve:
        alone = {g: _cost(b.together.by_gpu.get(g)) for g in gpus}
        served = [c for c in alone.values() if c is not None]
        together = _cost(b.together.best)
        bucketed = b.cost if math.isfinite(b.cost) else None
        ours = min((c for c in (together, bucketed) if c is not None), default=None)
        best_alone = min(served, default=None)
        worst_alone = max(served, default=None)
        rows.append(
            {
                "mix": traffic.source.removeprefix("melange "),
                "tpot_ms": tpot_ms,
                "rate_rps": b.rate,
                "input_len": problem.workload.input_len,
                "output_len": problem.workload.output_len,
                **{f"{g}_cost": alone[g] for g in gpus},
                **{f"{g}": _label(b.together.by_gpu.get(g)) for g in gpus},
                "together_cost": together,
                "together": _label(b.together.best),
                "bucketed_cost": bucketed,
                "bucketed": "; ".join(
                    f"{k.low}-{k.high}: {_label(s.best)}"
                    for k, s in zip(b.buckets, b.answers, strict=True)
                ),
                "ours_cost": ours,
                "saving_vs_best": _saving(ours, best_alone),
                "saving_vs_worst": _saving(ours, worst_alone),
                "together_saving_vs_best": _saving(together, best_alone),
                "curve_seconds": round(seconds, 1),
            }
        )
    return rows


def _label(d: Deployment | None) -> str:
    return "none" if d is None else d.label()


# Mélange's published savings against single-GPU-type deployments, over 1-32 req/s
# (its blog, docs/index.md of melange-release, and the paper's abstract): the low end is
# the rate where the best type alone came closest, the high end the worst type's largest.
PUBLISHED = {
    ("short", 120.0): (15, 77),
    ("short", 40.0): (9, 68),
    ("long", 120.0): (15, 33),
    ("long", 40.0): (2, 22),
    ("mixed", 120.0): (13, 51),
    ("mixed", 40.0): (4, 51),
}


def run_melange(
    out_dir: Path,
    command: str,
    on_case: Callable[[str, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every mix at every TPOT SLO; the traces in ``out_dir/melange/``, the rows in
    ``melange.json`` and the tables in ``melange.md``."""
    rows: list[dict[str, Any]] = []
    traces = make_dir(out_dir / "melange")
    summaries = []
    started = time.perf_counter()
    for mix in mixes():
        traffic = mix_traffic(mix)
        write_text(traces / f"{mix.name}.csv", trace_csv(traffic))
        summaries.append((mix, traffic))
        for tpot in TPOT_MS:
            done = size_mix(traffic, tpot)
            if on_case is not None:
                on_case(f"{mix.name}/{tpot:g} ms", done)
            rows += done
    total = time.perf_counter() - started
    write_text(out_dir / "melange.json", json.dumps(rows, indent=2) + "\n")
    write_text(out_dir / "melange.md", melange_markdown(rows, summaries, command, total))
    return rows


def size_command(mix: str, tpot_ms: float, rate: float, out_dir: str = "results/sizing") -> str:
    """The ``shardlab size`` command that sizes one cell of the tables."""
    prices = ",".join(f"{g}={p:g}" for g, p in PRICES.items())
    return (
        f"shardlab size --model {MODEL} --gpus {','.join(PRICES)} --price {prices} "
        f"--engine {ENGINE} --space engine --traffic {out_dir}/melange/{mix}.csv "
        f"--tpot-ms {tpot_ms:g} --rate {rate:g} --buckets {BUCKETS}"
    )


def _money(cost: float | None) -> str:
    return "none" if cost is None else f"${cost:,.2f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _span(values: Sequence[float | None]) -> tuple[float, float] | None:
    known = [v for v in values if v is not None]
    return (min(known), max(known)) if known else None


def melange_markdown(
    rows: list[dict[str, Any]],
    traffics: Sequence[tuple[Mix, Traffic]],
    command: str,
    seconds: float,
) -> str:
    gpus = tuple(PRICES)
    lines = [
        "# Mélange's problem: one GPU type against the mix",
        "",
        f"Produced by `{command}` ({seconds:.0f} s wall on 2 shared cores); do not edit "
        "by hand. Code: `shardlab/sizing/melange.py` (the setup and every choice below "
        "is stated in its docstring).",
        "",
        "## The setup, side by side",
        "",
    ]
    lines += markdown_table(
        ["", "Mélange (Griggs et al., 2024)", "here"],
        "lll",
        [
            ["model", "Llama-2-7B", f"{MODEL} (no Llama-2 in the catalog)"],
            [
                "engine",
                "vLLM, measured",
                f"{ENGINE}'s engine model, silicon timing where "
                "measured, CP-SAT's best plan per instance",
            ],
            [
                "GPU types",
                "L4 $0.70, A10G $1.01, A100-80GB $3.67, H100 $7.52 /h",
                ", ".join(f"{g.upper()} ${p:g}" for g, p in PRICES.items()) + " /GPU-h "
                "(Mélange's prices; no L4 or A10G in the catalog)",
            ],
            ["instances", "one GPU each", "1, 2, 4, 8 GPUs or whole nodes, any plan"],
            ["rates", "1, 2, 4, 8, 16, 32 req/s", ", ".join(f"{r:g}" for r in RATES)],
            ["SLO", "TPOT 120 ms or 40 ms", "mean TPOT 120 ms or 40 ms (no TTFT SLO)"],
            [
                "workloads",
                "Arena, PubMed, 80% Arena + 20% PubMed",
                "histograms at the datasets' published means (below)",
            ],
            [
                "the mix",
                "ILP over (size bucket x GPU type) slices, profiled throughputs",
                "exact covering over every type's instances, together (in proportion to "
                f"capacity) and by {BUCKETS} prompt-length buckets, the cheaper",
            ],
        ],
    )
    lines += [
        "",
        "## The traffics",
        "",
        f"{REQUESTS:,} requests each, Poisson arrivals (rescaled to each rate); on the "
        "mean, a sizing sees only the mean request (together) and each bucket's mean "
        "(by bucket). Prompt lengths: a log-normal of the published mean in 8 "
        "equal-weight steps (the spread is ours); outputs: the published mean. Words "
        f"to tokens at {TOKENS_PER_WORD} per word (an estimate); PubMed's prompts cut to "
        f"Llama-2's {LLAMA2_CONTEXT:,}-token context less the output.",
        "",
    ]
    lines += markdown_table(
        ["mix", "lengths from", "mean in", "mean out", "prompt p10/p50/p90", "trace"],
        "llrrll",
        [
            [
                m.name,
                m.what,
                f"{t.input_len.mean():,.0f}",
                f"{t.output_len.mean():,.0f}",
                "/".join(f"{int(v):,}" for v in _quantiles(t)),
                f"`melange/{m.name}.csv`",
            ]
            for m, t in traffics
        ],
    )
    lines += ["", "## Cost per hour at each rate", ""]
    for (mix, tpot), group in _groups(rows):
        lines += [
            f"### {mix}, TPOT <= {tpot:g} ms",
            "",
            f"Mean request {group[0]['input_len']:,} in / {group[0]['output_len']} out; "
            f"solved in {group[0]['curve_seconds']:g} s (every rate, together and by "
            f"bucket). One cell: `{size_command(mix, tpot, group[0]['rate_rps'])}` "
            "(another --rate for the other rows).",
            "",
        ]
        head = [
            "req/s",
            *(f"{g} only" for g in gpus),
            "mix together",
            "by bucket",
            "cheapest",
            "saving vs best type",
            "vs worst type",
        ]
        lines += markdown_table(
            head,
            "r" + "r" * len(gpus) + "llrrr",
            [
                [
                    f"{r['rate_rps']:g}",
                    *(_money(r[f"{g}_cost"]) for g in gpus),
                    f"{_money(r['together_cost'])} ({r['together']})",
                    f"{_money(r['bucketed_cost'])} ({r['bucketed']})",
                    _money(r["ours_cost"]),
                    _pct(r["saving_vs_best"]),
                    _pct(r["saving_vs_worst"]),
                ]
                for r in group
            ],
        )
        lines.append("")
    lines += [
        "## Savings side by side",
        "",
        "Mélange's range runs from its smallest saving against the best single type at "
        "any rate to its largest against the worst (its blog's plots 7-12: e.g. short "
        "at 120 ms, 15% against A10G alone at 1 req/s to 77% against H100 alone at 1 "
        "req/s). Ours: the same two ends over the same rates, with two types; 'cheapest' "
        "is the cheaper of the mix together and by bucket.",
        "",
    ]
    body = []
    for (mix, tpot), group in _groups(rows):
        low = _span([r["saving_vs_best"] for r in group])
        high = _span([r["saving_vs_worst"] for r in group])
        mixed = _span([r["together_saving_vs_best"] for r in group])
        lo, hi = PUBLISHED[(mix, tpot)]
        body.append(
            [
                mix,
                f"{tpot:g}",
                f"{lo}-{hi}%",
                "-" if low is None or high is None else f"{_pct(low[0])}-{_pct(high[1])}",
                "-" if low is None else f"{_pct(low[0])}-{_pct(low[1])}",
                "-" if mixed is None else f"{_pct(mixed[0])}-{_pct(mixed[1])}",
                ", ".join(f"{r['rate_rps']:g}" for r in group if _by_bucket_wins(r)) or "none",
            ]
        )
    lines += markdown_table(
        [
            "mix",
            "TPOT ms",
            "Mélange",
            "ours (same ends)",
            "ours vs best type",
            "mix together vs best type",
            "req/s where by bucket is cheapest",
        ],
        "lrrrrrl",
        body,
    )
    lines += ["", *explanation(rows)]
    return "\n".join(lines) + "\n"


def _quantiles(t: Traffic) -> list[float]:
    import numpy as np

    return [float(v) for v in np.percentile(t.input_len, (10, 50, 90), method="inverted_cdf")]


def _groups(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, float], list[dict[str, Any]]]]:
    out: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["mix"], r["tpot_ms"]), []).append(r)
    return list(out.items())


def _by_bucket_wins(r: dict[str, Any]) -> bool:
    together = r["together_cost"] if r["together_cost"] is not None else math.inf
    return r["bucketed_cost"] is not None and r["bucketed_cost"] < together * (1 - 1e-12)


def explanation(rows: list[dict[str, Any]]) -> list[str]:
    """What the tables reproduce of Mélange and why the rest cannot be, with the cells
    that say so taken from ``rows``."""
    cheap, dear = min(PRICES.values()), max(PRICES.values())
    mixed = [
        f"{r['mix']} at {r['tpot_ms']:g} ms, {r['rate_rps']:g} req/s "
        f"({r['together']}, {_pct(r['together_saving_vs_best'])})"
        for r in rows
        if (r["together_saving_vs_best"] or 0) > 1e-9
    ]
    return [
        "## What is reproduced and what cannot be",
        "",
        "- **The high end is the price ratio.** Mélange's high ends are all against H100 "
        "alone, at low rates where one GPU serves the rate: on short at 120 ms, 77% is "
        "one L4 and one A10G ($1.71) against one H100 ($7.52) at 1 req/s; on mixed, 51% "
        "is one A100 against one H100 at 1 req/s. With A100 the cheapest card here, the "
        f"same arithmetic gives 1 - {cheap:g}/{dear:g} = {_pct(1 - cheap / dear)}, our "
        "high end on every mix (Mélange's on mixed). The rest of its range needs L4 and A10G "
        "(not in the catalog until issue 52): their savings come from cheap cards "
        "serving short requests at low rates, where an A100 or H100 idles.",
        "- **A mix of A100 and H100 wins by rounding.** The covering "
        "already mixes types in proportion to capacity (`shardlab.sizing.size`), so "
        "'mix together' is Mélange's mix of types, proven least-cost under the cost "
        "model. It beats every type alone in: "
        + ("; ".join(mixed) if mixed else "no cell")
        + ". Elsewhere one type's instances round to the rate as well as any mix.",
        "- **Routing by length costs more here.** Each bucket gets whole instances of "
        "its own (`shardlab.sizing.buckets`); one GPU serves many requests/s of an 8B "
        f"model, so {BUCKETS} buckets pay for {BUCKETS} GPUs where one serves the whole "
        "rate. Mélange's ILP assigns slices of each bucket's rate to a GPU type and sums "
        "their loads per type, so one GPU holds slices of several buckets and no bucket "
        "pays for an idle instance. By bucket is cheapest at: "
        + (
            ", ".join(
                f"{r['mix']} {r['tpot_ms']:g} ms {r['rate_rps']:g} req/s"
                for r in rows
                if _by_bucket_wins(r)
            )
            or "no cell"
        )
        + ". A per-type pooled assignment of buckets (Mélange's) is not searched.",
        "- **Serving together is priced at the mean request.** On the mean SLO, the "
        "whole traffic is sized as its mean request (mixed: one request of the mean "
        "length, not 80% short and 20% long), which understates what long prompts "
        "cost in prefill and KV cache; by bucket prices each bucket's own mean. "
        "`--slo-percentile` simulates the real lengths (not run here).",
        "- **Instances and model.** Mélange counts single GPUs; here an instance is 1, "
        "2, 4 or 8 GPUs or whole nodes with CP-SAT's plan, aggregated or disaggregated, "
        "priced per GPU-hour. Capacities are the analytic model's (mean TPOT, Little's "
        "law), not measured. Llama-3.1-8B's GQA makes its KV cache a quarter of "
        "Llama-2-7B's, which raises every GPU's capacity on long prompts.",
    ]
