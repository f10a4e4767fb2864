"""A sizing's inputs as users write them: rates (a list or a range) and prices."""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.errors import ShardlabError
from shardlab.problems.limits import check_finite


def parse_prices(text: str | None, gpus: Sequence[str]) -> dict[str, float] | None:
    """``h100=2.99,h200=3.79`` -> $/GPU-hour per listed GPU (None: no prices)."""
    if text is None:
        return None
    prices: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip().lower()
        if not sep or not name:
            raise ShardlabError(
                f"prices {text!r}: write GPU=dollars per GPU-hour, e.g. h100=2.99,h200=3.79",
                field="price",
            )
        if name not in gpus:
            raise ShardlabError(
                f"price of {name!r}: it is not one of the GPU types ({', '.join(gpus)})",
                field="price",
                fix=f"list {name} among the GPU types, or drop its price",
            )
        try:
            price = float(value)
        except ValueError:
            raise ShardlabError(
                f"price {name}={value!r}: not a number of dollars per GPU-hour", field="price"
            ) from None
        check_finite(price, what=f"price of {name} ($/GPU-hour)", positive=True)
        prices[name] = price
    missing = [g for g in gpus if g not in prices]
    if missing:
        raise ShardlabError(
            f"prices: none for {', '.join(missing)}; a cost compares only GPUs all priced",
            field="price",
            fix="price every GPU type, or none (fewest GPUs)",
        )
    return prices


# Rates a curve takes at most (each is a cover over the kept capacities; a few hundred
# are quick, more is a typo in a range).
MAX_RATES = 200


def parse_rates(text: str, *, name: str = "rates") -> list[float]:
    """``5,10,20`` or ``START:STOP:STEP`` (``xF``: times F) -> rates, ascending."""
    text = text.strip()

    def number(value: str, what: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise ShardlabError(
                f"{name} {text!r}: {value!r} is not a number of requests/s", field=name
            ) from None
        # "rate must be ...", "rates '5:1:x2': step must be ..." (the input as written)
        said = name if what == name else f"{name} {text!r}: {what}"
        return check_finite(x, what=said, positive=True, field=name)

    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise ShardlabError(
                f"{name} {text!r}: a range is START:STOP:STEP (or xFACTOR), e.g. 5:80:x2",
                field=name,
            )
        start, stop = number(parts[0], "start"), number(parts[1], "stop")
        if stop < start:
            raise ShardlabError(f"{name} {text!r}: STOP is below START", field=name)
        step = parts[2].strip()
        factor = step.lower().startswith("x")
        by = number(step[1:] if factor else step, "step")
        if factor and by <= 1:
            raise ShardlabError(f"{name} {text!r}: a factor step must exceed 1", field=name)
        values, x = [], start
        while x <= stop * (1 + 1e-9) and len(values) <= MAX_RATES:
            values.append(round(x, 9))
            x = x * by if factor else x + by
    else:
        values = [number(v, "rate") for v in text.split(",")]
    if len(values) > MAX_RATES:
        raise ShardlabError(
            f"{name} {text!r}: more than {MAX_RATES} rates; give a coarser step", field=name
        )
    return sorted(set(values))
