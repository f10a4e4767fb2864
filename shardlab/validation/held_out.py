"""Engine costs for rows held out of the fit: each row replayed under costs fitted on
measured serving that did not see its group (its model family or GPU)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.problems.calibration import Calibration
from shardlab.validation.measurements import Measurement
from shardlab.validation.simulated_costs import Replayed0, fit_costs, replay_without_costs


def held_out_costs(
    grouping: str,
    timing: str = "silicon",
    progress: Callable[[int, int], None] | None = None,
    sample: Sequence[Measurement] | None = None,
    replayed: Sequence[Replayed0] | None = None,
    through_simulator: bool = True,
) -> Callable[[Measurement], Calibration]:
    """Each row's engine costs (per request, per iteration) fitted on measured serving
    (aiconfigurator-core's sample: aggregated InferenceX-protocol runs, the rows the
    shipped costs were fitted on) without the row's group (``family`` or ``gpu``):
    a replay under them saw nothing of the row's group. ``sample``: other measured
    serving rows to fit on instead. The simulator's own costs are fitted through the
    simulator (:mod:`shardlab.validation.simulated_costs`) on ``replayed``, the
    sample's TTFT and TPOT rows replayed without engine costs (default: replayed
    here); ``through_simulator`` False: those are not fitted (a
    replay would take the forms' fitted costs), for predictions by the analytic
    forms, which read only the forms' costs."""
    from shardlab.validation.calibrate import GROUPINGS, Rows, fit, linearize
    from shardlab.validation.predictions import fittable
    from shardlab.validation.serving_sample import read_sample

    if grouping not in ("family", "gpu"):
        raise ShardlabError(
            f"hold-out grouping {grouping!r}: a replay holds out a family or a gpu",
            field="hold_out",
        )
    label = GROUPINGS[grouping]
    if sample is None:
        sample = read_sample(mode=["agg"], protocol=["inferencex"]).rows
    sample = fittable(list(sample))
    linear = []
    for m in sample:
        linear.append(linearize(m, timing, m.engine or "trtllm"))
        if progress is not None:
            progress(len(linear), len(sample))
    priced = Rows(linear)
    labels = [label(m) for m in sample]
    if replayed is None and through_simulator:
        replayed = replay_without_costs(sample, timing)
    fits: dict[str, Any] = {}

    def costs(m: Measurement) -> Calibration:
        group = label(m)
        if group not in fits:
            keep = np.array([i for i, g in enumerate(labels) if g != group], dtype=np.int64)
            others = [r for r in replayed or () if label(r.measurement) != group]
            fits[group] = (
                fit(priced.take(keep), factors=False, per_engine=True),
                fit_costs(others) if through_simulator else None,
            )
        f, through = fits[group]
        engine = m.engine or "trtllm"
        simulated: dict[str, float | None] = {}
        if through is not None:
            simulated = {
                "simulated_request_ms": through[0].get(engine, f.request_ms.get(engine)),
                "simulated_iteration_ms": through[1].get(engine, f.iteration_ms.get(engine)),
            }
        return Calibration(
            timing=timing,
            request_ms=f.request_ms.get(engine),
            iteration_ms=f.iteration_ms.get(engine),
            fitted_on=f"measured serving without {grouping} {group}",
            **simulated,  # type: ignore[arg-type]
        )

    return costs
