"""The values each method's options take, in a module that imports nothing heavy: the
methods check against them, and the CLI's help lists them without loading Optuna or
PyTorch."""

from __future__ import annotations

# optuna: the sampler (the first is the default), how a plan becomes trial parameters,
# and what the first trials are
SAMPLERS: tuple[str, ...] = ("tpe", "gp", "cmaes", "random", "nsga2")
ENCODINGS: tuple[str, ...] = ("shared", "class")
WARM_STARTS: tuple[str, ...] = ("megatron", "none")
# rl: the policy-gradient update
ALGORITHMS: tuple[str, ...] = ("ppo", "reinforce")
# rl: how the policy proposes a plan (edit an elite plan, or decode one from scratch)
PROPOSALS: tuple[str, ...] = ("edit", "decode")


def listed(values: tuple[str, ...], default: str | None = None) -> str:
    """``a, b or c``, the default marked."""
    names = [f"{v} (default)" if v == default else v for v in values]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
