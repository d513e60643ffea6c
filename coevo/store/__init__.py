"""The shared trajectory store (SQLite, WAL): trajectories with steps, context artifacts, ES history.

``TrajectoryStore(path)`` opens (or creates) the store; see :mod:`coevo.store.store` for the storage
settings and the single-writer rule, :mod:`coevo.store.schema` for the tables, and
:mod:`coevo.store.export` for JSON Lines export
(``TrajectoryStore.export_jsonl`` or ``python -m coevo.store.export``).
"""

from coevo.store.artifacts import Artifact
from coevo.store.queries import TrajectoryFilter
from coevo.store.schema import SCHEMA_VERSION, SchemaError
from coevo.store.store import TrajectoryStore

__all__ = ["SCHEMA_VERSION", "Artifact", "SchemaError", "TrajectoryFilter", "TrajectoryStore"]
