"""Corrections of the cost model fitted to someone's own measurements.

``shardlab calibrate`` fits one factor per kernel class (the time of every GEMM, every
attention kernel, every routed-expert computation and every collective is multiplied
by its class's factor) and the engine's fixed costs per iteration (scheduling and
sampling, in every round) and per request (in TTFT) to measured rows; ``--calibration
FILE`` applies them to any problem, the fixed costs in place of the engine's shipped
ones (:mod:`shardlab.costmodel.engines`). A calibration is a small YAML file that says
what it was fitted on.

Accelerators with no measured kernels of their own (AMD's) come with a calibration
fitted to public measured runs, ``shardlab/data/calibrations/``: a problem on one of
them takes it when it is given none (:func:`shipped_for`); a user's replaces it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

import yaml

from shardlab.errors import ShardlabError

KERNEL_CLASSES = ("gemm", "attention", "moe", "communication")


@dataclass(frozen=True, kw_only=True)
class Calibration:
    gemm: float = 1.0
    attention: float = 1.0
    moe: float = 1.0
    communication: float = 1.0
    # the engine's fixed costs (None: the ones shardlab ships for it)
    iteration_ms: float | None = None  # per iteration, in every round
    request_ms: float | None = None  # per request, in TTFT
    # per request, in the simulator's TTFT (None: request_ms, else the shipped one)
    simulated_request_ms: float | None = None
    # per iteration, in the simulator's (None: iteration_ms, else the shipped one)
    simulated_iteration_ms: float | None = None
    timing: str = "roofline"  # the timing backend the factors correct
    fitted_on: str = ""  # the measurements, and how well the fit generalizes
    # the shipped fit's name when a problem took it by default (not in the file: a
    # calibration a user gives is theirs, whatever its values)
    shipped: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for key in KERNEL_CLASSES:
            value = getattr(self, key)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ShardlabError(f"calibration: {key} must be a positive factor, got {value!r}")
        for key in ("iteration_ms", "request_ms", "simulated_request_ms", "simulated_iteration_ms"):
            ms = getattr(self, key)
            if ms is None:
                continue
            if (
                isinstance(ms, bool)
                or not isinstance(ms, int | float)
                or not math.isfinite(ms)
                or ms < 0
            ):
                raise ShardlabError(f"calibration: {key} must be a non-negative number, got {ms!r}")

    def factor(self, kernel_class: str) -> float:
        return float(getattr(self, kernel_class))

    def to_yaml(self) -> str:
        return "# shardlab calibration (shardlab calibrate); apply with --calibration\n" + (
            yaml.safe_dump(
                {k: v for k, v in asdict(self).items() if k != "shipped"}, sort_keys=False
            )
        )

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        where = f"calibration {str(path)!r}"
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ShardlabError(f"{where}: cannot read it ({exc})") from None
        except yaml.YAMLError:
            raise ShardlabError(f"{where}: malformed YAML") from None
        if not isinstance(raw, dict):
            raise ShardlabError(f"{where}: must be a mapping written by `shardlab calibrate`")
        known = {f.name for f in fields(cls)} - {"shipped"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ShardlabError(f"{where}: unknown keys {', '.join(unknown)}")
        try:
            return cls(**raw)
        except ShardlabError as exc:
            raise ShardlabError(f"{where}: {str(exc).removeprefix('calibration: ')}") from None


# which shipped calibration each accelerator takes by default (file names under it)
SHIPPED_INDEX = "defaults.yaml"


@functools.cache
def _shipped() -> dict[str, Calibration]:
    """Accelerator key to its shipped calibration (named by its file), read once."""
    folder = resources.files("shardlab") / "data" / "calibrations"
    index = yaml.safe_load((folder / SHIPPED_INDEX).read_text()) or {}
    by_file = {
        name: replace(
            Calibration.load(Path(str(folder / name))), shipped=name.removesuffix(".yaml")
        )
        for name in sorted(set(index.values()))
    }
    return {key: by_file[name] for key, name in index.items()}


def shipped_for(accelerator_key: str) -> Calibration | None:
    """The calibration shardlab ships for an accelerator (None: it needs none, its
    kernels are measured or its roofline is not corrected)."""
    return _shipped().get(accelerator_key)


def shipped_name(calibration: Calibration) -> str | None:
    """The name of the shipped fit a problem took by default (its file, e.g.
    ``amd-cdna3``); None for a calibration given, even one read from a shipped file."""
    return calibration.shipped or None


def chosen(calibration: Calibration | None, accelerator_key: str) -> Calibration | None:
    """The calibration a problem on ``accelerator_key`` runs with: the one given, else
    the accelerator's shipped one. A shipped one taken by default for other GPUs (a
    problem moved to other GPUs, as sizing does) gives way to this one's."""
    if calibration is None or calibration.shipped:
        return shipped_for(accelerator_key)
    return calibration
