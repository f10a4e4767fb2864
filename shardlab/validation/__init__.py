"""Predictions of the cost model against measurements: the published ones, or a user's.

Its modules, by role: :mod:`~shardlab.validation.measurements` (the measurements file
and its rows; :mod:`~shardlab.validation.protocol`: their statistic, load and pools),
:mod:`~shardlab.validation.predictions` (each row's prediction),
:mod:`~shardlab.validation.report` (the markdown report, written where asked) and
:mod:`~shardlab.validation.aiconfigurator` (agreement with AIConfigurator's estimates).
Measured serving at a fixed concurrency comes from :mod:`shardlab.validation.serving_sample`.
"""

from shardlab.validation.aiconfigurator import (
    SIDE_BY_SIDE_COLUMNS,
    Agreement,
    against_reference,
    agreement_summary,
    side_by_side,
    write_agreement,
    write_side_by_side,
)
from shardlab.validation.loading import load_measurements
from shardlab.validation.measurements import (
    UNITS,
    Measurement,
    MeasurementSet,
    Refusal,
    builtin_measurements,
    read_csv,
)
from shardlab.validation.predictions import (
    Row,
    analytic,
    collective_seconds,
    collective_value,
    measured_disagg,
    measured_plan,
    predict,
    predict_all,
    problem_of,
    summarize,
)
from shardlab.validation.report import no_analytic_percentile, write_output, write_report

__all__ = [
    "SIDE_BY_SIDE_COLUMNS",
    "UNITS",
    "Agreement",
    "Measurement",
    "MeasurementSet",
    "Refusal",
    "Row",
    "against_reference",
    "agreement_summary",
    "analytic",
    "builtin_measurements",
    "collective_seconds",
    "collective_value",
    "load_measurements",
    "measured_disagg",
    "measured_plan",
    "no_analytic_percentile",
    "predict",
    "predict_all",
    "problem_of",
    "read_csv",
    "side_by_side",
    "summarize",
    "write_agreement",
    "write_output",
    "write_report",
    "write_side_by_side",
]
