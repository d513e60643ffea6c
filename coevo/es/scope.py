"""Parameter scopes: which tensors ES perturbs and updates.

Scopes (as in the Agentic-ESOpt reference, docs/references.md §1):
  * ``full``: every floating-point tensor;
  * ``all_linear``: 2-D ``*.weight`` tensors of linear layers, i.e. excluding embeddings (names
    containing ``embed``, ``wte``, ``wpe``), the output head (``lm_head``, a top-level ``output``) and
    norms (names containing ``norm``, ``ln_``). The rule works on names only, so it applies equally to
    HF modules, vLLM modules (whose linear classes are not ``nn.Linear``) and ``(name, tensor)`` lists.
Then ``include`` / ``exclude`` patterns refine the choice: a pattern is a shell glob matched against the
whole name (``fnmatch.fnmatchcase``), or a regular expression searched in the name when it starts with
``re:``. With ``include`` given, a name must match at least one include pattern; a name matching any
exclude pattern is dropped.

The result is in canonical order (sorted by name). Tensors sharing storage (tied embeddings listed
twice in a state dict) are kept once, under the first name given, so that no weight is perturbed twice.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

SCOPES = ("full", "all_linear")
_NOT_LINEAR = re.compile(r"(embed|(^|\.)wte\.|(^|\.)wpe\.|lm_head|^output\.|norm|(^|\.)ln_)")

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class ScopeSpec:
    """A parameter scope. ``scope`` in ``SCOPES``; ``include`` / ``exclude``: glob or ``re:`` patterns."""

    scope: str = "all_linear"
    include: tuple[str, ...] = field(default_factory=tuple)
    exclude: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")
        for fname in ("include", "exclude"):
            value = getattr(self, fname)
            if isinstance(value, str) or not all(isinstance(p, str) and p for p in value):
                raise ValueError(f"{fname} must be a list of non-empty pattern strings, got {value!r}")
            object.__setattr__(self, fname, tuple(value))
            for p in value:
                if p.startswith("re:"):
                    try:
                        re.compile(p[3:])
                    except re.error as e:
                        raise ValueError(f"{fname} pattern {p!r} is not a valid regex: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["include"], d["exclude"] = list(self.include), list(self.exclude)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScopeSpec:
        unknown = set(d) - {"scope", "include", "exclude"}
        if unknown:
            raise ValueError(f"unknown scope spec keys {sorted(unknown)}")
        return cls(d.get("scope", "all_linear"), tuple(d.get("include", ())), tuple(d.get("exclude", ())))


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def in_scope(name: str, tensor: torch.Tensor, spec: ScopeSpec) -> bool:
    """Whether one named tensor belongs to ``spec`` (see module docstring)."""
    if not tensor.is_floating_point():
        return False
    if spec.scope == "all_linear" and not (
        tensor.dim() == 2 and name.endswith(".weight") and not _NOT_LINEAR.search(name)
    ):
        return False
    if spec.include and not any(_matches(name, p) for p in spec.include):
        return False
    return not any(_matches(name, p) for p in spec.exclude)


def select_params(
    params: nn.Module | Iterable[tuple[str, torch.Tensor]],
    spec: ScopeSpec | dict[str, Any] | str = "all_linear",
) -> NamedTensors:
    """Select the tensors of a scope.

    Args:
        params: an ``nn.Module`` (its ``named_parameters()``) or ``(canonical name, tensor)`` pairs.
        spec: a ``ScopeSpec``, its dict form, or a scope name.

    Returns:
        ``[(name, tensor), ...]`` sorted by name; the tensors are the originals (no copies).

    Raises:
        ValueError: duplicate names, or an empty selection (the message shows the spec and some names).
    """
    if isinstance(spec, str):
        spec = ScopeSpec(spec)
    elif isinstance(spec, dict):
        spec = ScopeSpec.from_dict(spec)
    pairs = list(params.named_parameters()) if isinstance(params, nn.Module) else list(params)
    seen_names: set[str] = set()
    seen_storage: set[tuple[str, int, int]] = set()
    selected: NamedTensors = []
    for name, t in pairs:
        if name in seen_names:
            raise ValueError(f"duplicate tensor name {name!r} in params")
        seen_names.add(name)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"params[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
        if not in_scope(name, t, spec):
            continue
        ident = (str(t.device), t.data_ptr(), t.numel())
        if t.numel() and ident in seen_storage:
            continue
        seen_storage.add(ident)
        selected.append((name, t))
    if not selected:
        sample = sorted(seen_names)[:8]
        raise ValueError(f"scope {spec.to_dict()} selects no tensors (of {len(pairs)}; e.g. {sample})")
    selected.sort(key=lambda p: p[0])
    return selected
