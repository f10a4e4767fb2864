"""The ``shardlab`` command line: thin command groups over the library.

``app`` holds the root; each module registers its commands on it when imported:
:mod:`~shardlab.cli.catalog` (what is built in), :mod:`~shardlab.cli.plans` (one
plan), :mod:`~shardlab.cli.solve`, :mod:`~shardlab.cli.experiments` (runs that write
``results/``), :mod:`~shardlab.cli.checks` (against measurements), :mod:`~shardlab.cli.calibrate`
(fitted corrections) and
:mod:`~shardlab.cli.traffic` (a traffic's summary), :mod:`~shardlab.cli.simulate`
(a deployment under a traffic). Every table is drawn by
:mod:`~shardlab.cli.render`.
"""

from shardlab.cli import (  # noqa: F401 - registers
    calibrate,
    catalog,
    checks,
    experiments,
    plans,
    simulate,
    sizing,
    solve,
    traffic,
)
from shardlab.cli.app import app, main

__all__ = ["app", "main"]
