"""The ``shardlab`` command line: thin command groups over the library.

``app`` holds the root; each module registers its commands on it when imported:
:mod:`~shardlab.cli.catalog` (what is built in), :mod:`~shardlab.cli.plans` (one
plan), :mod:`~shardlab.cli.solve`, :mod:`~shardlab.cli.experiments` (runs that write
``results/``) and :mod:`~shardlab.cli.checks` (against measurements). Every table is
drawn by :mod:`~shardlab.cli.render`.
"""

from shardlab.cli import catalog, checks, experiments, plans, sizing, solve  # noqa: F401 - registers
from shardlab.cli.app import app, main

__all__ = ["app", "main"]
