"""Named registries of plug-in classes: evolvers, rollouts and heuristic problems share one behaviour.

A :class:`Registry` maps names to subclasses of one base class. Classes register themselves with a decorator
(``@register_rollout("countdown")``); a run config then refers to them by that name, by a dotted path
(``mypkg.module:MyClass`` or ``mypkg.module.MyClass``, imported without registering), or by the name of an
installed entry point in the registry's group (``[project.entry-points."coevo.rollouts"]``).

Rules, the same for every registry:

* registering a second, different object under a taken name raises ``ValueError`` (registering the same
  class again, e.g. on a re-import, is a no-op);
* only subclasses of the registry's base class are accepted (``TypeError`` otherwise), and a dotted path
  that names anything else is refused (``ValueError``);
* the built-in classes are found by importing every module of the registry's package (no hand-kept list
  of modules), once, on the first lookup;
* an unknown name raises ``ValueError`` listing the known names.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> classes deriving from ``base``.

    Args:
        what: what the registry holds, for messages (e.g. ``"rollout type"``).
        base: the class every registered class must subclass.
        package: dotted name of the package whose modules define the built-ins (all imported on the first
            lookup), or None.
        entry_point_group: the ``importlib.metadata`` entry-point group searched for names not registered
            (e.g. ``"coevo.rollouts"``), or None.
        name_attr: class attribute set to the registered name (e.g. ``"type_name"``), or None.
    """

    def __init__(
        self,
        what: str,
        base: type[T],
        *,
        package: str | None = None,
        entry_point_group: str | None = None,
        name_attr: str | None = None,
    ) -> None:
        self.what = what
        self.base = base
        self.package = package
        self.entry_point_group = entry_point_group
        self.name_attr = name_attr
        self._items: dict[str, type[T]] = {}
        self._discovered = False

    # ------------------------------------------------------------------ registering
    def add(self, name: str, cls: type[T]) -> type[T]:
        """Register ``cls`` under ``name``; returns ``cls``.

        Raises:
            TypeError: ``cls`` is not a subclass of the registry's base class.
            ValueError: ``name`` is empty or already names another object.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.what} name must be a non-empty string, got {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{cls!r} must subclass {self.base.__module__}.{self.base.__qualname__}")
        known = self._items.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"{self.what} {name!r} already registered by {known.__module__}.{known.__qualname__}")
        if self.name_attr:
            setattr(cls, self.name_attr, name)
        self._items[name] = cls
        return cls

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: ``@registry.register("name")`` (see :meth:`add`)."""
        return lambda cls: self.add(name, cls)

    def remove(self, name: str) -> None:
        """Forget ``name`` (no error when absent); for code that re-defines a class, e.g. tests."""
        self._items.pop(name, None)

    # ------------------------------------------------------------------ looking up
    def get(self, name: str) -> type[T] | None:
        """The class registered under ``name`` so far (no discovery), or None."""
        return self._items.get(name)

    def items(self) -> dict[str, type[T]]:
        """Every class: the built-ins, those registered by imported code, and the installed entry points.

        Raises:
            Exception: whatever loading a built-in module or an entry point raises (never swallowed).
        """
        self._discover()
        if self.entry_point_group:
            for ep in entry_points(group=self.entry_point_group):
                if ep.name not in self._items:
                    self.add(ep.name, ep.load())
        return dict(self._items)

    def names(self) -> list[str]:
        """Sorted names of :meth:`items`."""
        return sorted(self.items())

    def resolve(self, spec: str) -> type[T]:
        """The class for ``spec``: a registered name, an entry point's name, or a dotted path
        (``pkg.module:Class`` / ``pkg.module.Class``).

        Raises:
            ValueError: unknown name (the message lists the known ones); a dotted path that cannot be
                imported or names no subclass of the base class.
        """
        self._discover()
        if spec in self._items:
            return self._items[spec]
        if ":" in spec or "." in spec:
            return self._import(spec)
        known = self.items()
        if spec not in known:
            raise ValueError(f"unknown {self.what} {spec!r}; known types: {sorted(known)}")
        return known[spec]

    # ------------------------------------------------------------------ internals
    def _import(self, spec: str) -> type[T]:
        mod_name, _, attr = spec.replace(":", ".").rpartition(".")
        try:
            obj = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(f"{self.what} {spec!r}: cannot import it ({exc})") from exc
        if not (isinstance(obj, type) and issubclass(obj, self.base)):
            # a bad config value: ValueError, which pydantic reports as an error of the config field
            base = f"{self.base.__module__}.{self.base.__qualname__}"
            raise ValueError(f"{self.what} {spec!r} is not a subclass of {base}")  # noqa: TRY004
        return obj

    def _discover(self) -> None:
        if self._discovered or self.package is None:
            return
        self._discovered = True  # set first: a module that looks a name up while it is imported must not recurse
        try:
            pkg = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{self.package}."):
                importlib.import_module(info.name)
        except BaseException:
            self._discovered = False  # the next lookup raises the same error again instead of a partial list
            raise
