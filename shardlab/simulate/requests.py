"""What a simulated run records, request by request, and its summary: the
distribution of TTFT, TPOT, inter-token latency and end-to-end latency, throughput,
goodput and SLO attainment.

Definitions (those of vLLM's and SGLang's serving benchmarks):

- TTFT: first token minus arrival, plus the engine's fixed cost per request (HTTP,
  tokenization, the first streamed chunk: :attr:`IterationCosts.request_s`);
- end-to-end: last token minus arrival, plus the same cost;
- TPOT: (last token - first token) / (output - 1), for requests of two tokens or
  more (the first token excluded);
- ITL: every gap between two tokens of one request, over all tokens (a request's
  gaps are its iterations' times, with the prefill iterations it sat out on a
  prefill-first engine);
- goodput: requests per second that met every SLO given;
- prefix hit rate: prompt tokens found in the prefix cache of the rank each request
  ran on at its first prefill, over all prompt tokens (a traffic that states its prompts' prefixes:
  :mod:`shardlab.simulate.prefix`).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.traffic import Traffic
from shardlab.simulate.deployment import Deployment

STATISTICS = ("mean", "median", "p90", "p99", "p99.9")
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def check_statistic(name: str, *, field: str = "statistic") -> str:
    """``mean``, ``median`` or ``pNN`` with NN in (0, 100); refused otherwise."""
    if name in ("mean", "median"):
        return name
    m = re.fullmatch(r"p(\d+(?:\.\d+)?)", name)
    if m is None or not 0 < float(m.group(1)) < 100:
        raise ShardlabError(
            f"statistic {name!r}: not mean, median or a percentile pNN with NN in (0, 100)",
            field=field,
            fix="use e.g. mean, median, p90, p99, p99.9",
        )
    return name


def _statistic(values: np.ndarray, name: str, weights: np.ndarray | None = None) -> float:
    if len(values) == 0:
        return float("nan")
    if weights is None:
        if name == "mean":
            return float(values.mean())
        q = 50.0 if name == "median" else float(name[1:])
        return float(np.percentile(values, q))
    if name == "mean":
        return float(np.average(values, weights=weights))
    q = 50.0 if name == "median" else float(name[1:])
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    at = np.searchsorted(cum, q / 100.0 * cum[-1], side="left")
    return float(values[order][min(at, len(values) - 1)])


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Per-request limits: a request meets the SLO when under every one given."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ShardlabError(f"SLO {name} {v}: must be > 0", field=f"slo.{name}")

    @property
    def given(self) -> dict[str, float]:
        return {
            k: v for k in ("ttft_ms", "tpot_ms", "e2e_ms") if (v := getattr(self, k)) is not None
        }


@dataclass(frozen=True, kw_only=True)
class Summary:
    """A run in numbers: each latency's statistics (ms), rates, SLO attainment."""

    requests: int
    span_s: float  # first arrival to last token
    latencies: dict[str, dict[str, float]]  # metric -> statistic -> ms
    output_tok_s: float
    total_tok_s: float  # prompt and output tokens
    request_rate: float
    goodput: float | None  # requests/s that met every SLO (None: no SLO given)
    attainment: dict[str, float]  # SLO -> share of requests that met it ("all": every one)
    preemptions: int
    mean_in_flight: float
    prefix_hit_rate: float | None = (
        None  # prompt tokens found in a prefix cache (None: no prefixes)
    )

    def to_dict(self) -> dict:
        hits = {} if self.prefix_hit_rate is None else {"prefix_hit_rate": self.prefix_hit_rate}
        return {
            "requests": self.requests,
            "span_s": self.span_s,
            **self.latencies,
            "output_tok_s": self.output_tok_s,
            "total_tok_s": self.total_tok_s,
            "request_rate": self.request_rate,
            "goodput": self.goodput,
            "attainment": self.attainment,
            "preemptions": self.preemptions,
            "mean_in_flight": self.mean_in_flight,
            **hits,
        }


@dataclass(frozen=True, kw_only=True, eq=False)
class Simulation:
    """Every request's times (seconds from the first arrival) and where it ran."""

    deployment: Deployment
    traffic: Traffic
    router: str
    seed: int
    arrival_s: np.ndarray
    first_s: np.ndarray  # its first token made (a disaggregated one: handed over)
    finish_s: np.ndarray
    rank: np.ndarray  # the rank that decoded it
    request_s: float  # the engine's fixed cost per request, in TTFT and end-to-end
    itl_s: np.ndarray  # iteration gaps ...
    itl_n: np.ndarray  # ... and the tokens that had each
    preemptions: int
    wall_s: float  # seconds the run took (the pricing apart)
    # prompt tokens each request found in its rank's prefix cache (None: the traffic
    # states no prefixes)
    hit_tokens: np.ndarray | None = None

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens found in a prefix cache over all prompt tokens (None: the
        traffic states no prefixes)."""
        if self.hit_tokens is None:
            return None
        return float(self.hit_tokens.sum() / self.traffic.input_len.sum())

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_s - self.arrival_s + self.request_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s + self.request_s

    @property
    def tpot_s(self) -> np.ndarray:
        """Of requests of two output tokens or more."""
        return self._tpot_all()[self.traffic.output_len > 1]

    def latency(self, metric: str, statistic: str) -> float:
        """One statistic of one latency, in ms."""
        check_statistic(statistic)
        if metric == "itl_ms":
            return 1e3 * _statistic(self.itl_s, statistic, self.itl_n.astype(float))
        values = {"ttft_ms": self.ttft_s, "tpot_ms": self.tpot_s, "e2e_ms": self.e2e_s}
        if metric not in values:
            raise ShardlabError(f"metric {metric!r} is not one of {', '.join(LATENCIES)}")
        return 1e3 * _statistic(values[metric], statistic)

    def summary(self, slo: Slo | None = None, statistics: Sequence[str] = STATISTICS) -> Summary:
        for s in statistics:
            check_statistic(s)
        slo = slo or Slo()
        t = self.traffic
        span = float(np.nanmax(self.finish_s) - np.nanmin(self.arrival_s))
        span = span if span > 0 else float("nan")
        met = {
            "ttft_ms": self.ttft_s * 1e3,
            "tpot_ms": np.where(t.output_len > 1, self._tpot_all() * 1e3, 0.0),
            "e2e_ms": self.e2e_s * 1e3,
        }
        attainment: dict[str, float] = {}
        ok = np.ones(t.requests, dtype=bool)
        for name, limit in slo.given.items():
            good = met[name] <= limit
            attainment[name] = float(good.mean())
            ok &= good
        if slo.given:
            attainment["all"] = float(ok.mean())
        busy = float(np.nansum(self.finish_s - self.arrival_s))
        return Summary(
            requests=t.requests,
            span_s=span,
            latencies={m: {s: self.latency(m, s) for s in statistics} for m in LATENCIES},
            output_tok_s=float(t.output_len.sum()) / span,
            total_tok_s=float(t.output_len.sum() + t.input_len.sum()) / span,
            request_rate=t.requests / span,
            goodput=float(ok.sum()) / span if slo.given else None,
            attainment=attainment,
            preemptions=self.preemptions,
            mean_in_flight=busy / span,
            prefix_hit_rate=self.prefix_hit_rate,
        )

    def _tpot_all(self) -> np.ndarray:
        out = self.traffic.output_len
        return (self.finish_s - self.first_s) / np.maximum(out - 1, 1)

    def in_system(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """At each of ``times``: requests arrived and not finished, and of them those
        still waiting for their first token."""
        a = np.sort(self.arrival_s)
        f = np.sort(self.first_s)
        e = np.sort(self.finish_s)
        arrived = np.searchsorted(a, times, side="right")
        return (
            arrived - np.searchsorted(e, times, side="right"),
            arrived - np.searchsorted(f, times, side="right"),
        )

    def to_csv(self) -> str:
        """One row per request: arrival, first token, finish (s), lengths, rank (and
        the prompt tokens found in the prefix cache, when the traffic states prefixes)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        hits = self.hit_tokens
        w.writerow(["request", "arrival_s", "first_token_s", "finish_s", "input_tokens",
                    "output_tokens", "ttft_ms", "e2e_ms", "rank",
                    *([] if hits is None else ["cached_tokens"])])  # fmt: skip
        ttft, e2e = self.ttft_s * 1e3, self.e2e_s * 1e3
        for i in range(self.traffic.requests):
            w.writerow([
                i, f"{self.arrival_s[i]:.6f}", f"{self.first_s[i]:.6f}",
                f"{self.finish_s[i]:.6f}", int(self.traffic.input_len[i]),
                int(self.traffic.output_len[i]), f"{ttft[i]:.3f}", f"{e2e[i]:.3f}",
                int(self.rank[i]), *([] if hits is None else [int(hits[i])]),
            ])  # fmt: skip
        return buf.getvalue()
