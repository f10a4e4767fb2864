"""Where an Optuna study lives: a storage URL checked before the run, opened with a
heartbeat, so that a killed worker's running trial does not stay RUNNING forever.

A URL is a SQLAlchemy database URL (``sqlite:///study.db``,
``postgresql://user@host/db``). It is checked when the solver is made (its form, its
dialect, an SQLite file's directory and the file itself when it exists: a folder, an
unreadable file or one that is not an SQLite database is refused) and connected when
the study opens; every failure is one :class:`ShardlabError` (field ``storage``)
naming the URL without its password.

Heartbeat: while a trial runs, a thread marks it alive in the storage every
``HEARTBEAT_S`` seconds (Optuna's own mechanism, which ``study.optimize`` drives and an
ask-and-tell loop has to drive itself). A running trial unmarked for ``GRACE_S`` seconds
belongs to a worker that was killed (SIGKILL, a lost machine); whoever opens the study,
and every live worker every ``STALE_CHECK_TRIALS`` trials, tells it FAIL. A live
worker's trial is never failed: it is marked far more often than the grace period.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import sqlalchemy.exc
import sqlalchemy.orm
from optuna.storages import BaseStorage, RDBStorage
from sqlalchemy.engine import URL, make_url

from shardlab.errors import ShardlabError

HEARTBEAT_S = 5  # a running trial is marked alive this often
GRACE_S = 60  # a running trial unmarked this long was a killed worker's
STALE_CHECK_TRIALS = 50  # a live worker fails stale trials this often (and at the start)
CONNECT_TIMEOUT_S = 10  # a database server that does not answer in this time is refused


def _safe(url: str) -> str:
    """The URL as it may be printed: without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return repr(url)


def _refuse(url: str, message: str, fix: str) -> ShardlabError:
    return ShardlabError(f"storage {_safe(url)}: {message}", field="storage", fix=fix)


def check_storage_url(url: str) -> URL:
    """The parsed URL of a storage a study can open, or a refusal that says why."""
    example = "give a database URL, e.g. sqlite:///study.db or postgresql://user@host/db"
    if not url.strip():
        raise _refuse(url, "no URL given", example)
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise _refuse(url, "not a database URL", example) from None
    if parsed.drivername.startswith("redis"):
        raise _refuse(url, "Redis is a journal storage", example)
    try:
        dialect = parsed.get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:
        raise _refuse(url, f"unknown database {parsed.drivername!r}", example) from None
    try:
        dialect.import_dbapi()
    except ImportError as exc:
        other = " (or postgresql+psycopg2://, shardlab's test driver)"
        raise _refuse(
            url,
            f"its driver {exc.name or ''} is not installed",
            "pip install it" + (other if parsed.get_backend_name() == "postgresql" else ""),
        ) from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        _check_sqlite_file(url, Path(parsed.database))
    return parsed


# The first bytes of every SQLite database file (an empty file is a new database).
SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(url: str, path: Path) -> None:
    """Refuse an SQLite path SQLite cannot hold a study at: a missing folder, a folder,
    a file that cannot be read, or one that is not an SQLite database."""
    fix = "give the path of an SQLite database or of a file to create"
    if not path.parent.is_dir():
        raise _refuse(
            url,
            f"the database's folder {path.parent} does not exist",
            "create it or give another path",
        )
    if path.is_dir():
        raise _refuse(url, f"{path} is a folder, not a database file", fix)
    if not path.exists():
        return
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise _refuse(url, f"cannot read {path} ({exc.strerror or exc})", fix) from None
    if head and head != SQLITE_HEADER:
        raise _refuse(url, f"{path} is not an SQLite database", f"{fix}; move that file away")


def schema_race(exc: BaseException) -> bool:
    """Whether ``exc`` is a worker losing the race to create Optuna's tables in a fresh
    database: PostgreSQL raises an integrity or programming error, SQLite an operational
    error that the table "already exists"."""
    if isinstance(exc, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)):
        return True
    return isinstance(exc, sqlalchemy.exc.OperationalError) and "already exists" in str(exc)


def open_storage(storage: str | BaseStorage | None) -> BaseStorage | None:
    """The storage a study opens: a URL is connected with the heartbeat on (an object
    or None, the in-memory study, is used as given)."""
    if not isinstance(storage, str):
        return storage
    parsed = check_storage_url(storage)
    engine_kwargs = {}
    if parsed.get_backend_name() == "postgresql":
        engine_kwargs = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    try:
        return RDBStorage(
            storage,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
        )
    except (sqlalchemy.exc.DatabaseError, sqlalchemy.exc.InterfaceError) as exc:
        if schema_race(exc):
            raise  # workers racing to create the tables: the study's opening retries
        # not reachable or not writable, or a damaged SQLite file behind a valid header
        reason = " ".join(str(exc.orig or exc).split())[:200]
        raise _refuse(
            storage,
            f"cannot open the database ({reason})",
            "check that it is reachable, writable and a database",
        ) from None
    except ImportError as exc:
        raise _refuse(
            storage, f"its driver is not installed ({exc.name or exc})", "pip install it"
        ) from None


def _beats(storage: BaseStorage) -> bool:
    return isinstance(storage, optuna.storages._heartbeat.BaseHeartbeat) and (
        storage.get_heartbeat_interval() is not None
    )


@contextmanager
def heartbeat(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Mark ``trial_id`` alive now and every ``HEARTBEAT_S`` seconds until the block ends."""
    storage = study._storage
    if not _beats(storage):
        yield
        return
    storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def fail_stale_trials(study: optuna.Study) -> int:
    """Tell FAIL every running trial whose worker stopped marking it; how many."""
    if not _beats(study._storage):
        return 0
    before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
    optuna.storages.fail_stale_trials(study)
    for trial_id in _never_marked(study):
        study._storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL)
    after = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
    return after - before


def _never_marked(study: optuna.Study) -> list[int]:
    """Running trials that were never marked alive and started over ``GRACE_S`` ago.

    A trial is RUNNING from inside ``study.ask()``, which also samples its parameters,
    and is first marked alive after ``ask`` returns: a worker killed in between leaves a
    trial Optuna's own check skips (it only reads trials with a heartbeat), RUNNING
    forever."""
    storage = getattr(study._storage, "_backend", study._storage)  # under Optuna's cache
    if not isinstance(storage, RDBStorage):
        return []
    from optuna.storages._rdb import models

    grace = dt.timedelta(seconds=GRACE_S)
    with storage.scoped_session() as session:
        rows = (
            session.query(models.TrialModel)
            .options(sqlalchemy.orm.selectinload(models.TrialModel.heartbeats))
            .filter(models.TrialModel.state == optuna.trial.TrialState.RUNNING)
            .filter(models.TrialModel.study_id == study._study_id)
            .all()
        )
        now = dt.datetime.now()  # Optuna writes datetime_start from the worker's clock
        return [
            r.trial_id
            for r in rows
            if not r.heartbeats and r.datetime_start is not None and now - r.datetime_start > grace
        ]
