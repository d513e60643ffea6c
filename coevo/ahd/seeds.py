"""Seeds of a run's generated training and held-out instances that no candidate can know.

A candidate that knows the seed of its instances can regenerate them with numpy and plan ahead: online bin
packing stops being online (issue 27: 404.4 bins vs Best Fit's 422.0 on a config's training set, with the
seed read from the config). So unless the config names a seed, each run draws its own with
:mod:`secrets` when it starts and keeps it on the trusted side, in ``<run folder>/instance_seeds.json``
(the sandbox never sees the run folder); a resumed run reads the same seeds back, so its instances, cached
evaluations and report stay those of the run. An explicit seed in the config is still honoured (to compare
methods on the same instances), but it is knowable: a config is readable by anyone who writes candidates.
Published benchmark sets stay as published; their contents are public (README).

Online bin packing goes further (issue 45): its item streams are keyed by a secret drawn once per
installation (:func:`coevo.ahd.instances.keyed_rng`), so even a config's explicit seed does not reveal
them. :func:`check_instance_key` keeps that key's fingerprint in the run folder, so a resume on an
installation with another key stops with one line instead of evaluating on other instances.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

#: the file in the run folder holding the drawn seeds (``{"<evolver>/<role>": seed}``)
SEEDS_FILE = "instance_seeds.json"
#: the file in the run folder holding the fingerprint of the installation key its instances were drawn with
KEY_FILE = "instance_key_fingerprint"


def check_instance_key(run_dir: str | os.PathLike) -> str:
    """Record (first call) or check (resume) the fingerprint of this installation's instance key
    (:func:`coevo.ahd.instances.key_fingerprint`) in ``<run_dir>/instance_key_fingerprint``; returns it.

    Raises:
        coevo.errors.RunFolderError: the run was started with another key (its keyed instances, e.g. online
            bin packing's item streams, would differ); the message names both files.
    """
    from coevo.ahd.instances import instance_key_path, key_fingerprint
    from coevo.errors import RunFolderError

    mine = key_fingerprint()
    path = Path(run_dir) / KEY_FILE
    if path.is_file():
        stored = path.read_text().strip()
        if stored != mine:
            raise RunFolderError(
                f"{path}: the run's instances were drawn with instance key {stored}, this installation's "
                f"({instance_key_path()}) is {mine}; copy the run's key file there to resume it"
            )
        return mine
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(mine + "\n")
    return mine


def run_instance_seed(run_dir: str | os.PathLike, owner: str, role: str, explicit: int | None = None) -> int:
    """The seed of the instances ``owner`` uses for ``role`` (e.g. ``"train"``, ``"test"``) in this run.

    Args:
        run_dir: the run folder (trusted side). owner: the evolver's name. role: what the instances are for.
        explicit: the config's seed; returned as it is when not None.

    Returns:
        An int in ``[0, 2**62)``: ``explicit``, else the seed stored for ``owner/role`` in
        :data:`SEEDS_FILE`, else a fresh one drawn with :func:`secrets.randbits` and stored there first.

    Raises:
        ValueError: the seeds file exists but is not a JSON object of ints (the message names the file).
    """
    if explicit is not None:
        return int(explicit)
    path = Path(run_dir) / SEEDS_FILE
    key = f"{owner}/{role}"
    seeds: dict[str, int] = {}
    if path.is_file():
        try:
            seeds = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable seeds file ({exc})") from None
        if not isinstance(seeds, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in seeds.values()
        ):
            raise ValueError(f"{path}: expected a JSON object of seeds (ints >= 0)")
    if key not in seeds:
        seeds[key] = secrets.randbits(62)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{SEEDS_FILE}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(seeds, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return int(seeds[key])
