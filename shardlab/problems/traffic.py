"""A workload's requests: when each arrives, its prompt and output tokens.

A :class:`Traffic` holds one array per field, a request per index, in arrival order.
It is built from lengths (:class:`Lengths`: fixed, uniform in a range, a histogram of
buckets) and arrivals (:class:`Arrivals`: a closed loop, Poisson, Gamma) by
:func:`synthetic_traffic`, or read from a trace by :mod:`shardlab.problems.traces`
(which keeps the trace's own lengths and timestamps, optionally rescaled to another
rate with :meth:`Traffic.at_rate`, or replaced with :meth:`Traffic.with_arrivals`).

A closed loop has no arrival times: at most ``clients`` requests are in flight, and
the next request in order starts when one finishes (the benchmark protocol of vLLM's
and SGLang's ``--max-concurrency``). Only a simulator knows when that is, so a closed
loop is a mode of the traffic, not timestamps. Same seed, same requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.refusal import Refusal
from shardlab.problems.workload import check_prefix_reuse

ArrivalKind = Literal["closed", "poisson", "gamma", "trace"]
LengthKind = Literal["fixed", "uniform", "histogram"]
PERCENTILES = (50, 90, 99)


def _positive(value: float, field: str, what: str) -> None:
    if not np.isfinite(value) or value <= 0:
        raise ShardlabError(f"{what} must be a positive number, got {value!r}", field=field)


def _count(value: int, field: str, what: str) -> None:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ShardlabError(f"{what} must be a positive integer, got {value!r}", field=field)


def _frozen(values: np.ndarray) -> np.ndarray:
    values.setflags(write=False)
    return values


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """How long each request's prompt and output are.

    - ``fixed``: every request has ``input_len`` and ``output_len``;
    - ``uniform``: each uniform over the integers in [floor(r * n), n] of its nominal
      n, r = ``range_ratio`` (SGLang's ``bench_serving --random-range-ratio`` and
      InferenceX's protocol, r = 0.8; vLLM's newer benchmark spreads around n instead);
    - ``histogram``: (input, output, weight) ``buckets``, a bucket drawn per request
      with probability proportional to its weight.
    """

    kind: LengthKind = "fixed"
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 1.0
    buckets: tuple[tuple[int, int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "histogram"):
            raise ShardlabError(
                f"lengths {self.kind!r} is not one of fixed, uniform, histogram", field="lengths"
            )
        if self.kind == "histogram":
            if not self.buckets:
                raise ShardlabError("a histogram of lengths needs buckets", field="buckets")
            for i, o, w in self.buckets:
                _count(i, "buckets", "a bucket's input tokens")
                _count(o, "buckets", "a bucket's output tokens")
                if not np.isfinite(w) or w < 0:
                    raise ShardlabError(
                        f"a bucket's weight must be >= 0, got {w!r}", field="buckets"
                    )
            if sum(w for _, _, w in self.buckets) <= 0:
                raise ShardlabError("the buckets' weights sum to 0", field="buckets")
            return
        _count(self.input_len, "input_len", "input tokens")
        _count(self.output_len, "output_len", "output tokens")
        if not 0 < self.range_ratio <= 1:
            raise ShardlabError(
                f"the range ratio must be in (0, 1], got {self.range_ratio!r}", field="range_ratio"
            )

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """The input and output tokens of ``n`` requests."""
        if self.kind == "histogram":
            ins, outs, weights = (np.array(c, dtype=float) for c in zip(*self.buckets, strict=True))
            pick = rng.choice(len(weights), size=n, p=weights / weights.sum())
            return ins[pick].astype(np.int64), outs[pick].astype(np.int64)
        if self.kind == "fixed" or self.range_ratio == 1:
            return (
                np.full(n, self.input_len, dtype=np.int64),
                np.full(n, self.output_len, dtype=np.int64),
            )

        def draw(nominal: int) -> np.ndarray:
            return rng.integers(max(int(nominal * self.range_ratio), 1), nominal + 1, size=n)

        return draw(self.input_len).astype(np.int64), draw(self.output_len).astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class Arrivals:
    """When requests arrive.

    - ``closed``: no times; at most ``clients`` requests in flight;
    - ``poisson``: independent exponential gaps at ``rate`` requests/s;
    - ``gamma``: Gamma-distributed gaps of mean 1/``rate`` and coefficient of variation
      ``cv`` (above 1: bursts; 1 is Poisson; below 1: more regular).
    """

    kind: Literal["closed", "poisson", "gamma"] = "poisson"
    rate: float | None = None
    cv: float = 1.0
    clients: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "closed":
            if self.clients is None:
                raise ShardlabError("a closed loop needs its number of clients", field="clients")
            _count(self.clients, "clients", "clients")
            return
        if self.kind not in ("poisson", "gamma"):
            raise ShardlabError(
                f"arrival {self.kind!r} is not one of closed, poisson, gamma", field="arrival"
            )
        if self.rate is None:
            raise ShardlabError(f"{self.kind} arrivals need a rate (requests/s)", field="rate")
        _positive(self.rate, "rate", "the rate (requests/s)")
        _positive(self.cv, "cv", "the coefficient of variation of the gaps")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray | None:
        """Arrival seconds of ``n`` requests, the first at 0 (None: a closed loop)."""
        if self.kind == "closed":
            return None
        assert self.rate is not None
        if self.kind == "poisson":
            gaps = rng.exponential(1 / self.rate, size=n - 1)
        else:
            shape = 1 / self.cv**2  # a Gamma's CV is 1/sqrt(shape)
            gaps = rng.gamma(shape, 1 / (self.rate * shape), size=n - 1)
        return np.concatenate(([0.0], np.cumsum(gaps)))


# Tokens a block of Mooncake's hash ids stands for: every row of its traces has
# ceil(input_length / 512) ids (checked on the excerpt in tests/data/traces), and
# Dynamo replays them with trace_block_size=512
MOONCAKE_BLOCK_TOKENS = 512
# Tokens a block of a synthesized shared prefix holds: vLLM's default block size
REUSE_BLOCK_TOKENS = 16


@dataclass(frozen=True, kw_only=True, eq=False)
class Traffic:
    """Requests in arrival order: ``arrival_s`` (None in a closed loop), ``input_len``
    and ``output_len`` (tokens), and where known each prompt's prefix as a chain of
    blocks (``prefix_blocks``: ids, one per ``block_tokens`` tokens from the prompt's
    start; two prompts whose chains open with the same ids share those tokens).
    Mooncake's traces state them (``hash_ids``); :meth:`with_prefix_reuse` makes them
    up from a share of each prompt."""

    input_len: np.ndarray
    output_len: np.ndarray
    arrival_s: np.ndarray | None
    arrival: ArrivalKind
    clients: int | None = None  # a closed loop's requests in flight
    prefix_blocks: tuple[tuple[int, ...], ...] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS  # tokens per block of prefix_blocks
    source: str = "synthetic"
    refused: tuple[Refusal, ...] = ()  # a trace's rows that could not be read

    def __post_init__(self) -> None:
        n = len(self.input_len)
        if n == 0:
            raise ShardlabError(f"traffic {self.source!r} has no request", field="traffic")
        sizes = [len(self.output_len)]
        sizes += [] if self.arrival_s is None else [len(self.arrival_s)]
        sizes += [] if self.prefix_blocks is None else [len(self.prefix_blocks)]
        if any(s != n for s in sizes):
            raise ShardlabError(f"traffic {self.source!r}: its columns differ in length")
        if (self.arrival_s is None) != (self.arrival == "closed"):
            raise ShardlabError("a closed loop has no arrival times; every other traffic has")
        if self.arrival == "closed" and self.clients is None:
            raise ShardlabError("a closed loop needs its number of clients", field="clients")
        _count(self.block_tokens, "block_tokens", "tokens per prefix block")
        for name in ("input_len", "output_len", "arrival_s"):
            values = getattr(self, name)
            if values is not None:
                object.__setattr__(self, name, _frozen(np.array(values)))

    @property
    def requests(self) -> int:
        return len(self.input_len)

    @property
    def most_in_system(self) -> int | None:
        """The most requests in the system at once: a closed loop's clients (open
        arrivals: no bound, None)."""
        return self.clients if self.arrival == "closed" else None

    @property
    def span_s(self) -> float | None:
        """Seconds from the first arrival to the last (None: a closed loop)."""
        return None if self.arrival_s is None else float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def rate(self) -> float | None:
        """Mean requests/s: one over the mean gap (None: a closed loop or no gap)."""
        span = self.span_s
        return None if not span else (self.requests - 1) / span

    @property
    def gap_cv(self) -> float | None:
        """Burstiness: the coefficient of variation of the gaps between arrivals (1 for
        Poisson; None: a closed loop or no gap)."""
        if self.arrival_s is None or not self.span_s:
            return None
        gaps = np.diff(self.arrival_s)
        return float(gaps.std() / gaps.mean())

    def with_prefix_reuse(self, fraction: float) -> Traffic:
        """The same requests, each prompt opening with ``fraction`` of its tokens from
        one prefix every request shares (a system prompt and its examples), in blocks
        of :data:`REUSE_BLOCK_TOKENS`: request ``r``'s chain is the shared chain's
        first ``floor(fraction * input / block)`` blocks, the rest of its prompt its
        own. Once a rank's cache holds the chain, a prompt finds that share cached
        (less the block rounding): the analytic forms' ``prefix_reuse``. 0: no prefix
        (a trace's own blocks dropped too)."""
        fraction = check_prefix_reuse(fraction, field="prefix_reuse", where="traffic")
        if fraction == 0:
            return replace(self, prefix_blocks=None)
        counts = (self.input_len * fraction).astype(np.int64) // REUSE_BLOCK_TOKENS
        chain = tuple(range(int(counts.max())))
        return replace(
            self,
            prefix_blocks=tuple(chain[:k] for k in counts.tolist()),
            block_tokens=REUSE_BLOCK_TOKENS,
        )

    def at_rate(self, rate: float) -> Traffic:
        """The same requests and burstiness at another mean rate: every arrival time
        scaled by one factor, so the gaps' CV stays."""
        _positive(rate, "rate", "the rate (requests/s)")
        if self.arrival_s is None or self.rate is None:
            raise ShardlabError(
                f"traffic {self.source!r} has no arrival times to rescale", field="rate"
            )
        scaled = self.arrival_s[0] + (self.arrival_s - self.arrival_s[0]) * (self.rate / rate)
        return replace(self, arrival_s=scaled)

    def with_arrivals(self, arrivals: Arrivals, *, seed: int = 0) -> Traffic:
        """The same lengths (a trace's own, say) under other arrivals."""
        times = arrivals.sample(self.requests, np.random.default_rng(seed))
        return replace(self, arrival_s=times, arrival=arrivals.kind, clients=arrivals.clients)


def synthetic_traffic(
    *, requests: int, lengths: Lengths, arrivals: Arrivals, seed: int = 0
) -> Traffic:
    """``requests`` requests of these lengths and arrivals; same seed, same requests."""
    _count(requests, "requests", "the number of requests")
    rng = np.random.default_rng(seed)
    ins, outs = lengths.sample(requests, rng)
    return Traffic(
        input_len=ins,
        output_len=outs,
        arrival_s=arrivals.sample(requests, rng),
        arrival=arrivals.kind,
        clients=arrivals.clients,
    )


def closed_loop(
    *, clients: int, prompts_per_client: int, lengths: Lengths, seed: int = 0
) -> Traffic:
    """The benchmark protocol: ``clients`` x ``prompts_per_client`` requests, at most
    ``clients`` in flight."""
    _count(prompts_per_client, "prompts_per_client", "prompts per client")
    arrivals = Arrivals(kind="closed", clients=clients)
    return synthetic_traffic(
        requests=clients * prompts_per_client, lengths=lengths, arrivals=arrivals, seed=seed
    )


@dataclass(frozen=True, kw_only=True)
class TrafficSummary:
    """What a traffic is, in a few numbers: its lengths' percentiles are a request's
    own length (the inverted CDF), not interpolated."""

    source: str
    arrival: ArrivalKind
    requests: int
    clients: int | None
    span_s: float | None
    rate: float | None
    gap_cv: float | None
    input_len: dict[str, int]
    output_len: dict[str, int]
    refused: tuple[Refusal, ...]


def _percentiles(values: np.ndarray) -> dict[str, int]:
    at = np.percentile(values, PERCENTILES, method="inverted_cdf")
    return {
        **{f"p{p}": int(v) for p, v in zip(PERCENTILES, at, strict=True)},
        "max": int(values.max()),
        "mean": round(float(values.mean())),
    }


def summarize(traffic: Traffic) -> TrafficSummary:
    return TrafficSummary(
        source=traffic.source,
        arrival=traffic.arrival,
        requests=traffic.requests,
        clients=traffic.clients,
        span_s=traffic.span_s,
        rate=traffic.rate,
        gap_cv=traffic.gap_cv,
        input_len=_percentiles(traffic.input_len),
        output_len=_percentiles(traffic.output_len),
        refused=traffic.refused,
    )


def histogram(buckets: Sequence[tuple[int, int, float]]) -> Lengths:
    """Lengths drawn from (input, output, weight) buckets."""
    return Lengths(
        kind="histogram", buckets=tuple((int(i), int(o), float(w)) for i, o, w in buckets)
    )
