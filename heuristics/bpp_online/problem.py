"""Online 1-D bin packing: items arrive one by one; a priority function picks the bin (FunSearch / EoH).

Interface (EoH's name; FunSearch's ``priority`` is accepted as an alias)::

    score(item: int, bins: np.ndarray[int64] (k,)) -> np.ndarray (k,)

Exactly as FunSearch's ``online_binpack`` (Romera-Paredes et al., Nature 2024; the same loop in EoH's
``examples/bp_online/prob.py`` and ReEvo's ``problems/bpp_online/eval.py``): there are as many bins as
items, all starting empty (remaining capacity C); for each item, ``bins`` holds the remaining capacities of
the bins it fits in (empty ones included, a fresh writable copy, as upstream's ``bins[valid_bin_indices]``),
and the item goes to the bin of highest priority as ``np.argmax`` picks it: the first maximum, and the
FIRST NaN if there is any NaN (upstream behaviour; e.g. a heuristic computing ``0/0`` exactly at a perfect
fit sends the item to that bin). The objective is the number of non-empty bins at the end (minimise).
The return value must be numeric of shape (k,): a scalar, a wrong length, a non-numeric dtype, or priorities
that are ALL NaN are an InvalidReturn (never silently First Fit, as ``np.argmax`` would do upstream).

Instances: Weibull (FunSearch: sizes ~ Weibull(k=3) * 45, rounded, clipped to [1, 100], C = 100; 5k items
in the test set) or OR-Library style uniform (Falkenauer's u-classes: integers U[20, 100], C = 150;
n = 120, 250, 500, 1000). Reference: the L1 bound ceil(sum / C); gap = excess bins over L1, in %.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from coevo.ahd.instances import InstanceSet, key_fingerprint, keyed_rng, load_bpp_json
from coevo.ahd.problem import HeuristicProblem, register_problem
from coevo.ahd.references import bpp_l1_bound
from coevo.sandbox.errors import InvalidReturn

DISTRIBUTIONS = {"weibull": 100, "uniform": 150}  # distribution -> bin capacity


@register_problem
class BPPOnline(HeuristicProblem):
    """Online bin packing (minimise the number of bins used)."""

    name = "bpp_online"
    function_name = "score"
    function_aliases = ("priority",)
    direction = "minimize"
    objective_name = "bins used"
    task_description = (
        "Items of different sizes arrive one at a time and must each be placed, immediately and for good, "
        "into a bin of fixed capacity, using as few bins as possible. For the arriving item you are given "
        "the remaining capacities of the bins it fits in (unused bins included) and return one score per "
        "bin; the item goes to the bin with the highest score. Design a novel scoring function."
    )
    func_inputs = ("item", "bins")
    func_outputs = ("scores",)
    sizes = (1000, 5000, 10000)
    default_size = 5000
    default_count = 5
    reference_name = "L1 lower bound ceil(sum/C)"
    instance_fields = ("items", "capacity")
    time_exponent = 2.0  # n items, each scoring about n bins

    def generate(self, size: int, count: int, seed: int, distribution: str = "weibull") -> InstanceSet:
        """``count`` sequences of ``size`` items from ``distribution`` ("weibull", C = 100, or "uniform",
        U[20, 100] with C = 150), drawn with :func:`coevo.ahd.instances.keyed_rng` (``seed`` and this
        installation's secret key): the items are the future an online heuristic must not know, and a
        config's seed is public (issue 45). The same seed gives the same items on this installation."""
        self.check_args(size, count, seed)
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"bpp_online: distribution must be one of {sorted(DISTRIBUTIONS)}, got {distribution!r}")
        cap = DISTRIBUTIONS[distribution]
        rng = keyed_rng(seed, f"bpp_online/{distribution}")
        arrays = []
        for _ in range(count):
            if distribution == "weibull":
                items = np.clip(np.rint(rng.weibull(3.0, size) * 45.0), 1, cap).astype(np.int64)
            else:
                items = rng.integers(20, 101, size).astype(np.int64)
            arrays.append({"items": items, "capacity": np.array(cap, dtype=np.int64)})
        names = [f"{distribution}{size}_s{seed}_{i}" for i in range(count)]
        source = f"{distribution} n={size} C={cap} seed={seed} key={key_fingerprint()}"
        return InstanceSet(self.name, names, arrays, source)

    def solve_instance(self, fn, arrays):
        items = np.asarray(arrays["items"], dtype=np.int64)
        cap = int(arrays["capacity"])
        if items.size and (items.max() > cap or items.min() <= 0):
            raise ValueError(f"instance has item sizes outside (0, capacity={cap}]")
        bins = np.full(items.shape[0], cap, dtype=np.int64)
        for item in items.tolist():
            fits = np.flatnonzero(bins >= item)
            prio = _check_priorities(fn(item, bins[fits]), fits.size, self.function_name)  # bins[fits]: a copy
            bins[fits[int(np.argmax(prio))]] -= item  # argmax: first maximum, or first NaN
        return float(np.count_nonzero(bins != cap))

    def reference_one(self, arrays):
        return bpp_l1_bound(arrays["items"], int(arrays["capacity"]))

    def reference_solver_id(self) -> str:
        return "l1-bound"

    def load_instances(self, path: str | os.PathLike) -> InstanceSet:
        """An InstanceSet ``.npz`` or an OR-Library style JSON (``{"capacity", "instances"}``)."""
        path = Path(path)
        if path.suffix == ".json":
            return load_bpp_json(path)
        return super().load_instances(path)


def _check_priorities(value, k: int, what: str) -> np.ndarray:
    """Priorities as float64 (k,); InvalidReturn for a scalar, a wrong shape, non-numeric values, or all NaN
    (some NaN is allowed: ``np.argmax`` then picks the first NaN, as upstream)."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 -- an object numpy cannot wrap is the heuristic's fault
        raise InvalidReturn(f"{what} returned {type(value).__name__} that is not an array: {exc}") from None
    if arr.ndim == 0:
        raise InvalidReturn(f"{what} returned a scalar ({value!r}); expected an array of {k} priorities, one per bin")
    if arr.shape != (k,):
        raise InvalidReturn(f"{what} returned shape {arr.shape}; expected ({k},), one priority per bin")
    if arr.dtype.kind not in "biuf":
        raise InvalidReturn(f"{what} returned dtype {arr.dtype}; expected numbers")
    arr = arr.astype(np.float64)
    if k and np.isnan(arr).all():
        raise InvalidReturn(f"{what} returned NaN for all {k} priorities")
    return arr
