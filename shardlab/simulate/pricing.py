"""The iteration times of one plan read one at a time: the simulator prices an
iteration per event, where a numpy call per number would cost more than the event.

Each read is :class:`shardlab.costmodel.IterationCosts`' own (the same nodes, the same
linear interpolation between them, the first node's value below it), on Python floats;
``tests/simulate/test_pricing.py`` checks the two agree."""

from __future__ import annotations

from bisect import bisect_right

from shardlab.costmodel import IterationCosts


def _along(x: list[float], y: list[float], at: float) -> float:
    """``y`` as a function of ``x`` at ``at``: linear between nodes and past the last,
    the first node's value below it (``iterations._along`` on one number)."""
    if len(x) == 1:
        return y[0]
    k = bisect_right(x, at)
    k = 1 if k < 1 else len(x) - 1 if k > len(x) - 1 else k
    x0 = x[k - 1]
    t = (at - x0) / (x[k] - x0)
    if t < 0.0:
        t = 0.0
    return y[k - 1] + t * (y[k] - y[k - 1])


class Pricer:
    """Seconds of one iteration on one attention-DP rank (see
    :class:`shardlab.costmodel.IterationCosts` for what each is)."""

    __slots__ = (
        "_contexts",
        "_decode",
        "_lengths",
        "_mixed",
        "_prompt",
        "_ratio_context",
        "_ratios",
        "iteration_s",
        "stages",
        "top",
    )  # fmt: skip

    def __init__(self, costs: IterationCosts, stages: int = 1) -> None:
        self._contexts = costs.contexts.tolist()
        self._decode = costs.decode_s.tolist()  # a row per count of decoding requests
        self._ratios = costs.ratios.tolist()
        self._ratio_context = costs.ratio_context.tolist()
        self._mixed = costs.mixed_s.tolist()
        self._lengths = costs.prompts.tolist()
        self._prompt = costs.prompt_s.tolist()
        self.iteration_s = costs.iteration_s
        self.top = costs.max_requests
        self.stages = stages  # the plan's pipeline stages: prompts of one iteration overlap

    def decode(self, c: int, context: float) -> float:
        """``c`` requests decoding at mean ``context``, nothing else (``R + i``)."""
        return _along(self._contexts, self._decode[c], context)

    def prompt(self, tokens: float, done: float) -> float:
        """A prompt's ``tokens`` after ``done`` computed ones, alone (no ``i``)."""
        return _along(self._lengths, self._prompt, done + tokens) - _along(
            self._lengths, self._prompt, done
        )

    def prompts(self, alone: float, longest: float) -> float:
        """Several prompt chunks in one iteration with nothing decoding (no ``i``):
        ``alone`` seconds one after the other, the longest chunk ``longest``; on a
        pipeline each chunk is a micro-batch, so the round is ``max(S, m * S / pp)``
        of :mod:`shardlab.costmodel.iterations` with stages of equal time: the
        longest chunk through every stage, or the stages' share of all of them."""
        if self.stages == 1:
            return alone
        return max(longest, alone / self.stages)

    def mixed(self, c: int, context: float, prompt_tokens: float) -> float:
        """``c`` requests decoding at mean ``context`` beside ``prompt_tokens`` prompt
        tokens (``c >= 1``; the iteration cost included)."""
        ratio = prompt_tokens / c
        at = _along(self._ratios, self._ratio_context, ratio)
        return (
            _along(self._ratios, self._mixed[c], ratio)
            + self.decode(c, context)
            - self.decode(c, at)
        )
