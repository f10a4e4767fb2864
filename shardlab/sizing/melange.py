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
  (:func:`~shardlab.sizing.buckets.curve_by_bucket`, Mélange's routing by size);
- and again with the TPOT SLO at the 99th percentile of the mix's own requests,
  simulated (:func:`size_mix_tail`; together only).

Each mix's requests are written as a trace (``arrival_s,input_len,output_len``), so
that every cell is one ``shardlab size --traffic`` command, written beside its table
(:mod:`shardlab.sizing.melange_report` writes the tables).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


def mix_problem(
    traffic: Traffic, tpot_ms: float, gpus: Sequence[str], percentile: float | None = None
) -> Problem:
    """The problem ``shardlab size --traffic`` builds: the trace's mean request (and the
    SLO at ``percentile``, None: on the mean)."""
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
        slo_percentile=percentile,
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


# The percentile of the tail section: Mélange reports TPOT SLO attainment per request.
PERCENTILE = 99.0


def size_mix_tail(
    traffic: Traffic,
    tpot_ms: float,
    *,
    percentile: float = PERCENTILE,
    rates: Sequence[float] = RATES,
    gpus: Sequence[str] = tuple(PRICES),
) -> list[dict[str, Any]]:
    """One mix at one TPOT SLO held at ``percentile`` of the requests over ``rates``:
    each type alone against the cheapest mix served together, every instance's
    capacity simulated under the mix's own requests (:mod:`shardlab.sizing.tail`), and
    the answer simulated whole at each rate."""
    accs = builtin_accelerators()
    sizer = Sizer(
        mix_problem(traffic, tpot_ms, gpus, percentile),
        {g: accs[g] for g in gpus},
        prices={g: PRICES[g] for g in gpus},
        max_gpus=MAX_GPUS,
        traffic=traffic,
    )
    start = time.perf_counter()
    curve = sizer.curve(rates)
    seconds = time.perf_counter() - start
    rows = []
    for s in curve:
        alone = [d.cost for d in s.by_gpu.values() if d is not None]
        together = _cost(s.best)
        rows.append(
            {
                "mix": traffic.source.removeprefix("melange "),
                "tpot_ms": tpot_ms,
                "percentile": percentile,
                "rate_rps": s.rate,
                **{f"{g}_cost": _cost(s.by_gpu.get(g)) for g in gpus},
                "together_cost": together,
                "together": _label(s.best),
                "simulated_tpot_ms": (s.simulated or {}).get("tpot_ms"),
                "saving_vs_best": _saving(together, min(alone, default=None)),
                "saving_vs_worst": _saving(together, max(alone, default=None)),
                "curve_seconds": round(seconds, 1),
            }
        )
    return rows
