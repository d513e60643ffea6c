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

Hidden instance data (what an online heuristic must not know in advance) is drawn by :func:`keyed_rng`:
seeded from the seed AND a secret drawn once per installation, kept outside the sandbox (issue 45: a
config's public seed let a candidate regenerate online bin packing's item stream with numpy).
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_SEP = "/"


class NotAnInstanceSetError(ValueError):
    """A readable ``.npz`` without the ``__header__`` entry of :meth:`InstanceSet.save` (e.g. an EoH file)."""


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
        return InstanceSet(
            self.problem,
            self.names[:count],
            self.arrays[:count],
            self.source,
            ref,
            self.known_reference_name,
            dict(self.meta),
        )

    def validate(self) -> InstanceSet:
        """Check every instance's arrays against the field conventions; returns ``self``.

        Every array must be numeric and finite. Known fields: ``coords`` (n, 2); ``distances`` (n, n),
        n >= 2, >= 0, with n matching ``coords``; ``capacity`` a scalar > 0; ``items`` (m,), m >= 1,
        positive integers <= capacity; ``demands`` (n,) >= 0 matching ``distances``; ``weights`` and
        ``values`` (k,) >= 0 of equal shape.

        Raises:
            ValueError: naming the source (file), the instance and the field, e.g.
                ``"x.npz: instance 'a_0' field 'distances': 3 negative entries"``.
        """
        for name, inst in zip(self.names, self.arrays):
            problem = _instance_problem(inst)
            if problem:
                field_name, what = problem
                raise ValueError(f"{self.source or '<instances>'}: instance {name!r} field {field_name!r}: {what}")
        return self

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
            NotAnInstanceSetError: (a ValueError) a ``.npz`` without ``__header__``.
            ValueError: the file is not a ``.npz`` archive, or a malformed InstanceSet one (bad
                ``__header__``, keys not ``"<index>/<field>"``).
        """
        path = Path(path)
        with _open_npz(path) as data:
            if "__header__" not in data.files:
                raise NotAnInstanceSetError(
                    f"{path} is not an InstanceSet .npz (no __header__ entry); "
                    "use load_eoh_tsp_npz for EoH coordinate files"
                )
            try:
                header = json.loads(str(data["__header__"]))
                ref = data["__known_reference__"] if "__known_reference__" in data.files else None
                arrays: list[dict[str, np.ndarray]] = [{} for _ in header["names"]]
                for key in data.files:
                    if key.startswith("__"):
                        continue
                    idx, name = key.split(_SEP, 1)
                    arrays[int(idx)][name] = data[key]
                return cls(
                    header["problem"],
                    header["names"],
                    arrays,
                    header["source"],
                    ref,
                    header["known_reference_name"],
                    header.get("meta") or {},
                )
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}: malformed InstanceSet .npz ({type(exc).__name__}: {exc})") from None


#: Environment variable that, when set, is the instance key (64 hex digits) instead of the file's.
INSTANCE_KEY_VAR = "COEVO_INSTANCE_KEY"
#: The file under the coevo cache folder (``$COEVO_CACHE``, default ``~/.cache/coevo``) holding this
#: installation's instance key (:func:`installation_key`).
INSTANCE_KEY_FILE = "instance_key"


def instance_key_path() -> Path:
    """``$COEVO_CACHE/instance_key`` (default ``~/.cache/coevo/instance_key``)."""
    root = os.environ.get("COEVO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "coevo")
    return Path(root) / INSTANCE_KEY_FILE


def installation_key() -> bytes:
    """The 32 secret bytes that key this installation's hidden instance streams (:func:`keyed_rng`), drawn
    with :mod:`secrets` the first time and kept in :func:`instance_key_path` (mode 0600; created with
    ``O_EXCL``, so concurrent first uses agree). The sandbox never sees the cache folder. Copy the file
    to another installation, or set ``$COEVO_INSTANCE_KEY`` (64 hex digits; it wins over the file; the
    worker's environment never holds it) to generate the same instances there.

    Raises:
        ValueError: the key file or the variable does not hold 64 hex digits (the message names it).
    """
    import secrets

    given = os.environ.get(INSTANCE_KEY_VAR)
    if given is not None:
        try:
            key = bytes.fromhex(given.strip())
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ValueError(
                f"{INSTANCE_KEY_VAR}: expected 64 hex digits (an instance key), got {len(given)} characters"
            )
        return key
    path = instance_key_path()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"{path}: not an instance key (expected 64 hex digits); delete it to draw a new one")
    return key


def key_fingerprint() -> str:
    """The first 12 hex digits of SHA-256 of :func:`installation_key`: names the key in instance sources
    and reports without revealing it."""
    return hashlib.sha256(installation_key()).hexdigest()[:12]


def keyed_rng(seed: int, purpose: str) -> np.random.Generator:
    """A numpy generator for hidden instance data (an online problem's future): seeded from ``seed`` AND
    this installation's secret :func:`installation_key`, so a candidate that knows the seed (a config names
    it) cannot regenerate the data, while the same ``(seed, purpose)`` gives the same data on this
    installation (resume, comparison across runs). ``purpose`` (e.g. ``"bpp_online/weibull"``) separates
    streams that share a seed. Source: ``np.random.SeedSequence`` over the key's, the purpose's hash's and
    the seed's 32-bit words."""
    words = np.frombuffer(hashlib.sha256(installation_key() + purpose.encode()).digest(), dtype="<u4")
    return np.random.default_rng(np.random.SeedSequence([*words.tolist(), int(seed)]))


def _instance_problem(inst: dict[str, np.ndarray]) -> tuple[str, str] | None:
    """The first ``(field, problem)`` of one instance's arrays, or None when they follow the conventions
    of :meth:`InstanceSet.validate`."""
    arrs = {k: np.asarray(v) for k, v in inst.items()}
    for key, arr in arrs.items():
        if arr.dtype.kind not in "biuf":
            return key, f"dtype {arr.dtype} is not numeric"
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return key, f"{int((~np.isfinite(arr)).sum())} non-finite (NaN/inf) entries"
    shape_rules = {
        "coords": (2, "(n, 2)"),
        "distances": (2, "(n, n)"),
        "capacity": (0, "a scalar"),
        "items": (1, "(m,)"),
        "demands": (1, "(n,)"),
        "weights": (1, "(k,)"),
        "values": (1, "(k,)"),
    }
    for key, (ndim, text) in shape_rules.items():
        if key in arrs and arrs[key].ndim != ndim:
            return key, f"shape {arrs[key].shape}, expected {text}"
    for key in ("distances", "demands", "weights", "values"):
        if key in arrs and (neg := int((arrs[key] < 0).sum())):
            return key, f"{neg} negative entries"
    if "coords" in arrs and arrs["coords"].shape[1] != 2:
        return "coords", f"shape {arrs['coords'].shape}, expected (n, 2)"
    if "distances" in arrs:
        d = arrs["distances"]
        if d.shape[0] != d.shape[1] or d.shape[0] < 2:
            return "distances", f"shape {d.shape}, expected a square (n, n) matrix with n >= 2"
        for key in ("coords", "demands"):
            if key in arrs and arrs[key].shape[0] != d.shape[0]:
                return key, f"{arrs[key].shape[0]} rows but distances is {d.shape}"
    if "capacity" in arrs and not arrs["capacity"] > 0:
        return "capacity", f"must be > 0, got {arrs['capacity'].item()!r}"
    if "items" in arrs:
        items = arrs["items"]
        if items.size == 0:
            return "items", "no items"
        if (items <= 0).any() or (items != np.round(items)).any():
            return "items", "item sizes must be positive integers"
        if "capacity" in arrs and items.max() > arrs["capacity"]:
            return "items", f"item size {items.max()} exceeds capacity {arrs['capacity'].item()}"
    if "weights" in arrs and "values" in arrs and arrs["weights"].shape != arrs["values"].shape:
        return "values", f"shape {arrs['values'].shape} differs from weights {arrs['weights'].shape}"
    return None


def _open_npz(path: Path) -> Any:
    """``np.load(path, allow_pickle=False)`` of a real ``.npz`` (zip) archive; FileNotFoundError / ValueError
    naming the file otherwise (never numpy's pickle message)."""
    if not path.is_file():
        raise FileNotFoundError(f"instances file not found: {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path}: not a .npz (zip) archive; save instances with InstanceSet.save or np.savez")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: unreadable .npz ({exc})") from None


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
        FileNotFoundError: no such file.
        ValueError: not a ``.npz`` archive, a required key is missing, shapes disagree, or an array breaks
            the conventions of :meth:`InstanceSet.validate` (NaN, negative distances, ...).
    """
    path = Path(path)
    with _open_npz(path) as data:
        for key in ("coords", "distances"):
            if key not in data.files:
                raise ValueError(
                    f"{path}: neither an InstanceSet .npz (no __header__) nor an EoH TSP .npz "
                    f"(missing key {key!r}; found {data.files})"
                )
        coords, dist = data["coords"], data["distances"]
    if coords.ndim != 3 or dist.shape != coords.shape[:2] + (coords.shape[1],):
        raise ValueError(f"{path}: coords {coords.shape} and distances {dist.shape} do not match (B,n,2)/(B,n,n)")
    b = coords.shape[0] if count is None else min(count, coords.shape[0])
    arrays = [{"coords": coords[i].astype(np.float64), "distances": dist[i].astype(np.float64)} for i in range(b)]
    return InstanceSet("tsp_construct", [f"{path.stem}_{i}" for i in range(b)], arrays, str(path)).validate()


# EDGE_WEIGHT_TYPEs computed from 2-D NODE_COORDs by tsplib95's distance functions (TSPLIB 95, section 2)
TSPLIB_COORD_TYPES = ("EUC_2D", "CEIL_2D", "ATT", "GEO", "MAN_2D", "MAX_2D")


def load_tsplib(
    paths: list[str | os.PathLike] | str | os.PathLike, optima: dict[str, float] | str | os.PathLike | None = None
) -> InstanceSet:
    """TSPLIB ``.tsp`` files (one instance each) as a ``tsp_construct`` set.

    Files are parsed by ``tsplib95``; distances follow the TSPLIB distance function of the file's
    EDGE_WEIGHT_TYPE (Reinelt 1991, TSPLIB 95 section 2): EUC_2D is computed vectorised as
    nint(sqrt(dx^2 + dy^2)) (identical to ``tsplib95``'s ``get_weight``); the other types of
    :data:`TSPLIB_COORD_TYPES` and EXPLICIT matrices use ``tsplib95``'s ``get_weight`` pair by pair.
    ``optima`` is a dict or the path of a JSON ``{name: optimal length}``; when every instance is listed
    the set carries them as its known reference ("TSPLIB optimum").

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: naming the file and field: not UTF-8 text, unparsable (e.g. a bad number), TYPE not
            TSP/ATSP, DIMENSION missing or < 3, EDGE_WEIGHT_TYPE missing or not supported (EUC_3D, XRAY,
            SPECIAL, ...), fewer or more NODE_COORDs than DIMENSION, or NaN / negative distances.
    """
    import tsplib95

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if optima is not None and not isinstance(optima, dict):
        optima = json.loads(Path(optima).read_text())
    names, arrays, refs = [], [], []
    for p in map(Path, paths):
        name, inst = _read_tsplib_file(p, tsplib95)
        names.append(name)
        arrays.append(inst)
        refs.append(optima.get(name) if optima else None)
    known = np.array(refs, dtype=np.float64) if refs and all(r is not None for r in refs) else None
    return InstanceSet(
        "tsp_construct",
        names,
        arrays,
        ",".join(map(str, paths)),
        known,
        "TSPLIB optimum" if known is not None else None,
    ).validate()


def _read_tsplib_file(p: Path, tsplib95: Any) -> tuple[str, dict[str, np.ndarray]]:
    """One checked TSPLIB file -> (name, {"coords": (n, 2), "distances": (n, n)}); see :func:`load_tsplib`."""
    if not p.is_file():
        raise FileNotFoundError(f"TSPLIB file not found: {p}")
    try:
        prob = tsplib95.load(str(p))
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not a UTF-8 text file (is it a TSPLIB .tsp?)") from None
    except Exception as exc:  # noqa: BLE001 -- tsplib95 raises ParsingError and plain exceptions alike
        raise ValueError(f"{p}: not a valid TSPLIB file: {exc}") from None
    if prob.type not in ("TSP", "ATSP"):
        raise ValueError(
            f"{p}: "
            + (
                "no TYPE field (is it a TSPLIB .tsp file?)"
                if prob.type is None
                else f"TYPE is {prob.type!r}, expected TSP or ATSP"
            )
        )
    n = prob.dimension
    if not isinstance(n, int) or n < 3:
        raise ValueError(f"{p}: DIMENSION is {n!r}, expected an int >= 3")
    wtype = prob.edge_weight_type
    if wtype not in TSPLIB_COORD_TYPES + ("EXPLICIT",):
        raise ValueError(
            f"{p}: EDGE_WEIGHT_TYPE {wtype!r} is not supported; use one of {', '.join(TSPLIB_COORD_TYPES)} or EXPLICIT"
        )
    nodes = list(prob.get_nodes())
    if wtype != "EXPLICIT" and len(prob.node_coords) != n:
        raise ValueError(f"{p}: NODE_COORD_SECTION has {len(prob.node_coords)} nodes but DIMENSION is {n}")
    if wtype != "EXPLICIT" and any(len(prob.node_coords[u]) != 2 for u in nodes):
        raise ValueError(f"{p}: NODE_COORD_SECTION entries must have 2 coordinates for {wtype}")
    coords = np.array([prob.node_coords[u] for u in nodes], dtype=np.float64) if prob.node_coords else np.zeros((n, 2))
    try:
        if wtype == "EUC_2D":  # TSPLIB: nint(sqrt(dx^2 + dy^2)), as tsplib95's get_weight
            dist = np.floor(euclidean_matrix(coords) + 0.5)
        else:
            dist = np.array(
                [[prob.get_weight(u, v) if u != v else 0.0 for v in nodes] for u in nodes], dtype=np.float64
            )
    except Exception as exc:  # noqa: BLE001 -- e.g. an EDGE_WEIGHT_SECTION shorter than the matrix
        field_name = "EDGE_WEIGHT_SECTION" if wtype == "EXPLICIT" else "NODE_COORD_SECTION"
        raise ValueError(
            f"{p}: cannot compute {wtype} distances from {field_name}: {type(exc).__name__}: {exc}"
        ) from None
    if dist.shape != (n, n):
        raise ValueError(f"{p}: EDGE_WEIGHT_SECTION gives a {dist.shape} matrix but DIMENSION is {n}")
    return prob.name or p.stem, {"coords": coords, "distances": dist}


def load_bpp_json(path: str | os.PathLike, count: int | None = None) -> InstanceSet:
    """Online bin packing JSON ``{"capacity": int, "instances": {name: [int sizes in arrival order]}}``.

    Each instance gets ``items`` (m,) int64 and ``capacity`` () int64.

    Raises:
        FileNotFoundError: no such file.
        ValueError: naming the file and field: not UTF-8 JSON (with the line of a syntax error), missing
            or non-integer / non-positive ``capacity``, missing or empty ``instances``, an instance that is
            not a non-empty list of integers, or an item outside (0, capacity].
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"instances file not found: {path}")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a UTF-8 JSON file") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(doc, dict):
        msg = f'{path}: expected a JSON object {{"capacity": int, "instances": {{...}}}}'
        raise ValueError(msg)  # noqa: TRY004 -- bad file content, not a caller's type error
    for key in ("capacity", "instances"):
        if key not in doc:
            raise ValueError(f"{path}: missing key {key!r}")
    cap = doc["capacity"]
    if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
        raise ValueError(f"{path}: field 'capacity' must be a positive integer, got {cap!r}")
    if not isinstance(doc["instances"], dict) or not doc["instances"]:
        raise ValueError(f"{path}: field 'instances' must be a non-empty object {{name: [item sizes]}}")
    names, arrays = [], []
    for name, items in list(doc["instances"].items())[:count]:
        if (
            not isinstance(items, list)
            or not items
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in items)
        ):
            raise ValueError(f"{path}: field 'instances.{name}' must be a non-empty list of integer item sizes")
        items = np.asarray(items, dtype=np.int64)
        if items.max() > cap or items.min() <= 0:
            raise ValueError(f"{path}: instance {name!r} has item sizes outside (0, capacity={cap}]")
        names.append(name)
        arrays.append({"items": items, "capacity": np.array(cap, dtype=np.int64)})
    return InstanceSet("bpp_online", names, arrays, str(path)).validate()


def load_cvrplib(paths: list[str | os.PathLike] | str | os.PathLike) -> InstanceSet:
    """CVRPLIB ``.vrp`` files through ``vrplib`` (distances as ``vrplib`` computes them: EUC_2D without
    rounding unless the file says otherwise). The depot is moved to index 0 when it is not already there.

    Each instance gets ``coords`` (n+1, 2), ``demands`` (n+1,) int64 (depot 0), ``distances`` (n+1, n+1)
    float64 and ``capacity`` () int64.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: naming the file: unparsable, more than one depot, no capacity, or arrays that break
            :meth:`InstanceSet.validate`.
    """
    import vrplib

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    names, arrays = [], []
    for p in map(Path, paths):
        if not p.is_file():
            raise FileNotFoundError(f"CVRPLIB file not found: {p}")
        try:
            inst = vrplib.read_instance(str(p))
        except Exception as exc:  # noqa: BLE001 -- vrplib raises whatever its parser hits
            raise ValueError(f"{p}: not a valid CVRPLIB file: {type(exc).__name__}: {exc}") from None
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
        arrays.append(
            {
                "coords": coords,
                "demands": demands,
                "distances": dist,
                "capacity": np.array(int(inst["capacity"]), dtype=np.int64),
            }
        )
    return InstanceSet("cvrp_construct", names, arrays, ",".join(map(str, paths))).validate()
