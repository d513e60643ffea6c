"""The frames exchanged with the step server (:mod:`coevo.sandbox.worker`), seen from the trusted side.

Frame: a 4-byte big-endian header length, a UTF-8 JSON header, then the raw bytes of each array the
header lists (``"arrays": [{"dtype": "<f8", "shape": [k]}, ...]``, C order). Inside the header's value
tree, ``{"__nd__": i}`` stands for the i-th array, ``{"__list__": i}`` for the i-th array read back
as a (nested) list (how the worker sends lists of numbers, nested lists of them included), and ``{"__const__": k}`` for a constant sent earlier; a
failure's text travels as a uint8 array (:func:`reply_text`).

Everything read back from the candidate's process is untrusted data: :class:`FrameReader` refuses a
header above ``max_header`` bytes or a frame above ``max_frame`` bytes, parses the header with
:func:`json.loads` only (no pickle, nothing that runs code; ``NaN``/``Infinity`` become floats), accepts
array dtypes from :data:`coevo.sandbox.worker.DTYPES` only and exactly ``prod(shape) * itemsize`` bytes
per array with no dimension above ``max_frame`` (so an empty array of shape ``[0, 2**62, 2**62]`` is refused
too), and raises :class:`MalformedFrame` for anything else. The bounds are checked on the header's length
prefix and the array specs, before anything is parsed or copied; the caller sets them per call to what the
called function can return (:meth:`coevo.sandbox.session.RemoteFunction.accept_replies`), so a reply
padded with junk is refused unread instead of costing the trusted process CPU.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from coevo.sandbox.worker import DTYPES

_LEN = struct.Struct(">I")
_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_DTYPES = {s: np.dtype(s) for s in DTYPES}
MAX_DEPTH = 64


class MalformedFrame(ValueError):
    """The candidate's process sent bytes that are not a well-formed reply frame."""


def encode_frame(header: dict[str, Any], arrays: list[np.ndarray] = ()) -> bytes:
    """One frame of ``header`` (a JSON-able dict) and ``arrays`` (contiguous arrays of a :data:`DTYPES` dtype).

    Raises:
        TypeError: an array of another dtype (a trusted-side bug: convert before sending).
    """
    if arrays:
        specs = []
        for a in arrays:
            if a.dtype.str not in _DTYPES:
                raise TypeError(f"cannot send an array of dtype {a.dtype} to the candidate")
            specs.append({"dtype": a.dtype.str, "shape": list(a.shape)})
        header = {**header, "arrays": specs}
    head = json.dumps(header, allow_nan=True).encode("utf-8")
    return b"".join([_LEN.pack(len(head)), head, *(np.ascontiguousarray(a).tobytes() for a in arrays)])


class FrameReader:
    """Accumulates bytes from the reply pipe and cuts them into frames (see the module docstring).

    Args:
        max_header: largest JSON header accepted (bytes). max_frame: largest whole frame accepted (bytes).
    """

    def __init__(self, max_header: int = 1 << 20, max_frame: int = 8 << 20):
        self.max_header = max_header
        self.max_frame = max_frame
        self.buf = bytearray()
        self._parsed: tuple[dict[str, Any], list, int] | None = None  # the pending frame's header, once read

    def feed(self, data: bytes) -> None:
        """Append bytes read from the pipe. Raises MalformedFrame when more than one frame's worth is pending."""
        self.buf += data
        if len(self.buf) > self.max_frame + 4 + self.max_header:
            raise MalformedFrame(f"more than {self.max_frame} bytes of reply pending")

    def next(self) -> tuple[dict[str, Any], list[np.ndarray]] | None:
        """The next complete frame as ``(header, arrays)`` (arrays are read-only), or None if incomplete.

        Raises:
            MalformedFrame: oversized header or frame, invalid JSON, a header that is not an object, an
                array spec with an unknown dtype or a bad shape.
        """
        if self._parsed is None:
            self._parsed = self._head()
            if self._parsed is None:
                return None
        header, layout, total = self._parsed  # parsed once, however many pieces the arrays arrive in
        if len(self.buf) < total:
            return None
        arrays = []
        for dtype, shape, start, nbytes in layout:
            try:
                arr = np.frombuffer(bytes(self.buf[start : start + nbytes]), dtype=dtype).reshape(shape)
            except (ValueError, MemoryError) as exc:
                raise MalformedFrame(f"array of shape {list(shape)[:8]} in reply: {str(exc)[:100]}") from None
            arrays.append(arr)  # frombuffer on bytes: read-only
        del self.buf[:total]
        self._parsed = None
        return header, arrays

    def _head(self) -> tuple[dict[str, Any], list, int] | None:
        """The pending frame's header, array layout and total size, or None while its header is incomplete."""
        if len(self.buf) < 4:
            return None
        (size,) = _LEN.unpack_from(self.buf)
        if size > self.max_header:
            raise MalformedFrame(f"reply header of {size} bytes exceeds {self.max_header}")
        if len(self.buf) < 4 + size:
            return None
        try:
            header = json.loads(bytes(self.buf[4 : 4 + size]).decode("utf-8"), parse_constant=_CONSTANTS.__getitem__)
        except (ValueError, RecursionError, KeyError) as exc:
            raise MalformedFrame(f"reply header is not valid JSON: {str(exc)[:100]}") from None
        if not isinstance(header, dict):
            raise MalformedFrame("reply header is not a JSON object")
        specs = header.get("arrays", [])
        if not isinstance(specs, list):
            raise MalformedFrame("reply 'arrays' is not a list")
        layout = []
        total = 4 + size
        for spec in specs:
            if (
                not isinstance(spec, dict)
                or spec.get("dtype") not in _DTYPES
                or not isinstance(spec.get("shape"), list)
                or len(spec["shape"]) > 8
                or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s for s in spec["shape"])
            ):
                raise MalformedFrame(f"bad array spec in reply: {str(spec)[:100]}")
            dtype = _DTYPES[spec["dtype"]]
            if any(s > self.max_frame for s in spec["shape"]):  # also for empty arrays: [0, 2**62, 2**62]
                raise MalformedFrame(f"array shape {str(spec['shape'])[:100]} in reply exceeds {self.max_frame}")
            nbytes = math.prod(spec["shape"]) * dtype.itemsize
            if total + nbytes > self.max_frame:
                raise MalformedFrame(f"reply larger than {self.max_frame} bytes")
            layout.append((dtype, tuple(spec["shape"]), total, nbytes))
            total += nbytes
        return header, layout, total


def decode_value(tree: Any, arrays: list[np.ndarray], depth: int = 0) -> Any:
    """The value a reply tree stands for: JSON scalars, lists, dicts with str keys, and arrays for
    ``{"__nd__": i}``.

    Raises:
        MalformedFrame: a reference to a missing array, or nesting deeper than :data:`MAX_DEPTH`.
    """
    if depth > MAX_DEPTH:
        raise MalformedFrame("reply value nested too deeply")
    if isinstance(tree, list):
        return [decode_value(v, arrays, depth + 1) for v in tree]
    if isinstance(tree, dict):
        if "__nd__" in tree:
            idx = tree["__nd__"]
            if len(tree) != 1 or not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(arrays):
                raise MalformedFrame(f"bad array reference in reply: {str(tree)[:80]}")
            return arrays[idx]
        if "__list__" in tree:
            idx = tree["__list__"]
            if len(tree) != 1 or not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(arrays):
                raise MalformedFrame(f"bad list reference in reply: {str(tree)[:80]}")
            if arrays[idx].ndim == 0:
                raise MalformedFrame("list in reply sent as a 0-d array")
            return arrays[idx].tolist()
        return {k: decode_value(v, arrays, depth + 1) for k, v in tree.items()}
    return tree


def reply_text(tree: Any, arrays: list[np.ndarray], limit: int = 2000) -> str:
    """The failure text of a reply: its UTF-8 bytes sent as a uint8 array (``{"__nd__": i}``), or a JSON
    string; at most ``limit`` characters. Never raises (an unusable value gives its ``str``)."""
    if isinstance(tree, dict) and set(tree) == {"__nd__"}:
        idx = tree["__nd__"]
        if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(arrays):
            arr = arrays[idx]
            if arr.dtype == np.uint8 and arr.ndim == 1:
                return arr[: limit * 4].tobytes().decode("utf-8", errors="replace")[:limit]
    return str(tree)[:limit]
