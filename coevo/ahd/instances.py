"""Problem instances for automatic heuristic design: one container, ``.npz`` storage, and loaders for the
public benchmark formats.

An :class:`InstanceSet` is a list of instances, each a dict of named numpy arrays (so sizes may differ
between instances, as in TSPLIB), plus optional known reference objectives (e.g. TSPLIB optima). It is
saved to ``.npz`` without pickle (keys ``"<index>/<field>"``, names and metadata as unicode arrays) so a
sandbox worker can load it with ``np.load(path, allow_pickle=False)``.

Loaders for real data:

- :func:`load_tsplib` -- TSPLIB ``.tsp`` files (Reinelt 1991) through ``tsplib95``; EUC_2D distances are
  rounded to the nearest integer exactly as TSPLIB defines (``nint(sqrt(dx^2+dy^2))``); the optimum is taken
  from an ``optima.json`` (``{name: length}``) when the instance name is listed.
- :func:`load_eoh_tsp_npz` -- EoH's TSP test sets converted to ``.npz`` (keys ``coords`` (B, n, 2) and
  ``distances`` (B, n, n), float64).
- :func:`load_bpp_json` -- OR-Library style online bin packing JSON
  ``{"capacity": int, "instances": {name: [item sizes...]}}`` (FunSearch's OR3 and Weibull 5k).
- :func:`load_cvrplib` -- CVRPLIB ``.vrp`` files through ``vrplib`` (Uchoa et al. 2017 format).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_SEP = "/"


@dataclass
class InstanceSet:
    """A batch of instances of one problem.

    Attributes:
        problem: name of the problem the instances belong to (e.g. ``"tsp_construct"``).
        names: one name per instance.
        arrays: one dict per instance mapping field name -> numpy array (field names are problem-defined,
            e.g. TSP ``coords`` (n, 2) float64 and ``distances`` (n, n) float64).
        source: where the instances came from (file path, or generator and seed).
        known_reference: optional per-instance reference objectives (e.g. TSPLIB optima), shape (B,).
        known_reference_name: what ``known_reference`` is (e.g. ``"TSPLIB optimum"``).

    Raises:
        ValueError: if ``names``, ``arrays`` and ``known_reference`` lengths disagree, or a field name
            contains ``"/"``.
    """

    problem: str
    names: list[str]
    arrays: list[dict[str, np.ndarray]]
    source: str = ""
    known_reference: np.ndarray | None = None
    known_reference_name: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.arrays):
            raise ValueError(f"names has {len(self.names)} entries but arrays has {len(self.arrays)}")
        if not self.arrays:
            raise ValueError("arrays: an InstanceSet needs at least one instance")
        for inst in self.arrays:
            for key in inst:
                if _SEP in key:
                    raise ValueError(f"arrays: field name {key!r} must not contain {_SEP!r}")
        if self.known_reference is not None:
            self.known_reference = np.asarray(self.known_reference, dtype=np.float64)
            if self.known_reference.shape != (len(self.arrays),):
                raise ValueError(
                    f"known_reference has shape {self.known_reference.shape}, expected ({len(self.arrays)},)"
                )

    def __len__(self) -> int:
        return len(self.arrays)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self.arrays)

    def subset(self, count: int) -> InstanceSet:
        """The first ``count`` instances (``count`` >= 1; ValueError otherwise)."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        ref = None if self.known_reference is None else self.known_reference[:count]
        return InstanceSet(self.problem, self.names[:count], self.arrays[:count], self.source, ref,
                           self.known_reference_name, dict(self.meta))

    def content_hash(self) -> str:
        """SHA-256 (hex) of the problem name and every array's dtype, shape and bytes, in order.

        Names and source do not enter the hash, so the same data loaded from two paths share cached
        references.
        """
        h = hashlib.sha256(self.problem.encode())
        for inst in self.arrays:
            for key in sorted(inst):
                arr = np.ascontiguousarray(inst[key])
                h.update(f"{key}|{arr.dtype.str}|{arr.shape}".encode())
                h.update(arr.tobytes())
        return h.hexdigest()

    def save(self, path: str | os.PathLike) -> Path:
        """Write the set to an uncompressed ``.npz`` (no pickle). Returns the path written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        out: dict[str, np.ndarray] = {}
        for i, inst in enumerate(self.arrays):
            for key, arr in inst.items():
                out[f"{i}{_SEP}{key}"] = np.asarray(arr)
        header = {
            "problem": self.problem,
            "names": list(self.names),
            "source": self.source,
            "known_reference_name": self.known_reference_name,
            "meta": self.meta,
        }
        out["__header__"] = np.array(json.dumps(header))
        if self.known_reference is not None:
            out["__known_reference__"] = self.known_reference
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        with open(tmp, "wb") as fh:
            np.savez(fh, **out)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstanceSet:
        """Read a set written by :meth:`save` (``allow_pickle=False``).

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not an InstanceSet ``.npz`` (no ``__header__``).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"instances file not found: {path}")
        with np.load(path, allow_pickle=False) as data:
            if "__header__" not in data.files:
                raise ValueError(f"{path} is not an InstanceSet .npz (no __header__ entry); "
                                 "use load_eoh_tsp_npz for EoH coordinate files")
            header = json.loads(str(data["__header__"]))
            ref = data["__known_reference__"] if "__known_reference__" in data.files else None
            arrays: list[dict[str, np.ndarray]] = [{} for _ in header["names"]]
            for key in data.files:
                if key.startswith("__"):
                    continue
                idx, name = key.split(_SEP, 1)
                arrays[int(idx)][name] = data[key]
        return cls(header["problem"], header["names"], arrays, header["source"], ref,
                   header["known_reference_name"], header.get("meta") or {})


def euclidean_matrix(coords: np.ndarray) -> np.ndarray:
    """Pairwise Euclidean distances. coords (n, 2) float -> (n, n) float64."""
    coords = np.asarray(coords, dtype=np.float64)
    diff = coords[:, None, :] - coords[None, :, :]
    return np.sqrt((diff**2).sum(-1))


def load_eoh_tsp_npz(path: str | os.PathLike, count: int | None = None) -> InstanceSet:
    """EoH TSP test set stored as ``.npz`` with ``coords`` (B, n, 2) and ``distances`` (B, n, n) float64.

    The stored distance matrices are used as they are (tour lengths in EoH are computed from them).
    ``count`` keeps the first ``count`` instances (EoH's ``runEval.py`` evaluates the first 64).

    Raises:
        ValueError: a required key is missing or shapes disagree.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as data:
        for key in ("coords", "distances"):
            if key not in data.files:
                raise ValueError(f"{path}: missing key {key!r} (found {data.files})")
        coords, dist = data["coords"], data["distances"]
    if coords.ndim != 3 or dist.shape != coords.shape[:2] + (coords.shape[1],):
        raise ValueError(f"{path}: coords {coords.shape} and distances {dist.shape} do not match (B,n,2)/(B,n,n)")
    b = coords.shape[0] if count is None else min(count, coords.shape[0])
    arrays = [{"coords": coords[i].astype(np.float64), "distances": dist[i].astype(np.float64)} for i in range(b)]
    return InstanceSet("tsp_construct", [f"{path.stem}_{i}" for i in range(b)], arrays, str(path))


def load_tsplib(paths: list[str | os.PathLike] | str | os.PathLike,
                optima: dict[str, float] | str | os.PathLike | None = None) -> InstanceSet:
    """TSPLIB ``.tsp`` files (one instance each) as a ``tsp_construct`` set.

    Files are parsed by ``tsplib95``; distances follow the TSPLIB distance function of the file's
    EDGE_WEIGHT_TYPE: EUC_2D is computed vectorised as nint(sqrt(dx^2 + dy^2)) (identical to
    ``tsplib95``'s ``get_weight``, which the other types use pair by pair). ``optima`` is a dict or the
    path of a JSON ``{name: optimal length}``; when every instance is listed the set carries them as its
    known reference ("TSPLIB optimum").

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a file has no node coordinates or explicit weights.
    """
    import tsplib95

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if optima is not None and not isinstance(optima, dict):
        optima = json.loads(Path(optima).read_text())
    names, arrays, refs = [], [], []
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"TSPLIB file not found: {p}")
        prob = tsplib95.load(str(p))
        nodes = list(prob.get_nodes())
        n = len(nodes)
        coords = np.array([prob.node_coords[u] for u in nodes], dtype=np.float64) if prob.node_coords \
            else np.zeros((n, 2))
        if prob.edge_weight_type == "EUC_2D":  # TSPLIB: nint(sqrt(dx^2 + dy^2)), as tsplib95's get_weight
            dist = np.floor(euclidean_matrix(coords) + 0.5)
        else:
            dist = np.array([[prob.get_weight(u, v) if u != v else 0.0 for v in nodes] for u in nodes],
                            dtype=np.float64)
        name = prob.name or p.stem
        names.append(name)
        arrays.append({"coords": coords, "distances": dist})
        refs.append(optima.get(name) if optima else None)
    known = np.array(refs, dtype=np.float64) if refs and all(r is not None for r in refs) else None
    return InstanceSet("tsp_construct", names, arrays, ",".join(map(str, paths)), known,
                       "TSPLIB optimum" if known is not None else None)


def load_bpp_json(path: str | os.PathLike, count: int | None = None) -> InstanceSet:
    """Online bin packing JSON ``{"capacity": int, "instances": {name: [int sizes in arrival order]}}``.

    Each instance gets ``items`` (m,) int64 and ``capacity`` () int64.

    Raises:
        ValueError: missing ``capacity`` / ``instances`` or an item larger than the capacity.
    """
    path = Path(path)
    doc = json.loads(path.read_text())
    for key in ("capacity", "instances"):
        if key not in doc:
            raise ValueError(f"{path}: missing key {key!r}")
    cap = int(doc["capacity"])
    names, arrays = [], []
    for name, items in list(doc["instances"].items())[:count]:
        items = np.asarray(items, dtype=np.int64)
        if items.size and (items.max() > cap or items.min() <= 0):
            raise ValueError(f"{path}: instance {name!r} has item sizes outside (0, capacity={cap}]")
        names.append(name)
        arrays.append({"items": items, "capacity": np.array(cap, dtype=np.int64)})
    return InstanceSet("bpp_online", names, arrays, str(path))


def load_cvrplib(paths: list[str | os.PathLike] | str | os.PathLike) -> InstanceSet:
    """CVRPLIB ``.vrp`` files through ``vrplib`` (distances as ``vrplib`` computes them: EUC_2D without
    rounding unless the file says otherwise). The depot is moved to index 0 when it is not already there.

    Each instance gets ``coords`` (n+1, 2), ``demands`` (n+1,) int64 (depot 0), ``distances`` (n+1, n+1)
    float64 and ``capacity`` () int64.

    Raises:
        ValueError: more than one depot or no capacity.
    """
    import vrplib

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    names, arrays = [], []
    for p in map(Path, paths):
        inst = vrplib.read_instance(str(p))
        depots = np.atleast_1d(inst.get("depot", [0]))
        if len(depots) != 1:
            raise ValueError(f"{p}: expected one depot, found {len(depots)}")
        if "capacity" not in inst:
            raise ValueError(f"{p}: no CAPACITY")
        d = int(depots[0])
        order = [d] + [i for i in range(inst["dimension"]) if i != d]
        dist = np.asarray(inst["edge_weight"], dtype=np.float64)[np.ix_(order, order)]
        coords = np.asarray(inst.get("node_coord", np.zeros((inst["dimension"], 2))), dtype=np.float64)[order]
        demands = np.asarray(inst["demand"], dtype=np.int64)[order]
        names.append(str(inst.get("name", p.stem)))
        arrays.append({"coords": coords, "demands": demands, "distances": dist,
                       "capacity": np.array(int(inst["capacity"]), dtype=np.int64)})
    return InstanceSet("cvrp_construct", names, arrays, ",".join(map(str, paths)))


def shared_data_dir() -> Path:
    """The shared benchmark data folder: ``$COEVO_SHARED_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("COEVO_SHARED_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "data"
