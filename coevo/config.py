"""Run configuration: YAML files validated with pydantic.

A run config names the model, decoding settings, budgets, the evolvers (each validated by the ``Config``
class of its registered type) and the schedule the loop runs them in. Unknown keys are errors everywhere,
and every error names the field (``evolvers.eoh.population_size``) and, for choices, the allowed values.

Beyond each section's own fields, :func:`parse_config` rejects combinations that cannot work, naming the
fields involved, before any model is loaded or any API called (:func:`check_combinations`):

* a parameter-space evolver (``space = "parameter"``, e.g. ``type: es``) on a backend without weights
  (``model.backend: openai``); without any model, ``coevo run`` refuses it (:func:`coevo.loop.check_runnable`;
  in code a policy may be passed to the loop instead);
* a field named ``evolver`` or ``evolvers`` (in an evolver's params or its nested ``rollout`` / ``gate``
  specs: the convention for references to other evolvers of the run) naming an evolver the config does not
  have, or the evolver itself;
* ``workers >= 1`` (members rolled out on Ray actors, which have no run context) with a rollout that calls
  another evolver of the run (``rollout.evolver``, e.g. ``eoh_children``); and ``workers >= 1`` on a backend
  other than ``hf`` (both checked by :func:`coevo.placement.placement_errors`). (Published context, e.g. a prompt
  or a skill, is sent with each Ray job.)
* each evolver config's :meth:`~coevo.evolvers.base.EvolverConfig.link` (cross-evolver checks of its own).

Plug-ins: ``plugins: [mymodule, mypkg.evolvers]`` (or ``coevo run --import mymodule``) imports user modules
before any type is resolved, so classes they register (``@register_evolver("name")``, ``@register_rollout``)
can be named by ``type:`` anywhere in the config; the current folder is on the import path for them. Types
are resolved independently of the order evolvers are listed: plug-ins first, then every dotted-path type
(whose import may register further names), then registered names. A new run records where each plug-in
module was loaded from (``plugins.json`` in the run folder, :func:`plugin_origins`), so resuming it and
``coevo es replay`` find the module from any folder (:func:`load_run_config` in :mod:`coevo.loop` passes the
record to :func:`parse_config`); when the module cannot be found there either, the error names the module,
the file it was loaded from and the fix.

Example::

    run: {name: tsp_eoh, seed: 2024}
    model: {name: qwen2.5-coder-0.5b-instruct, backend: hf, dtype: bfloat16}
    sampling: {max_new_tokens: 512, temperature: 1.0, top_p: 0.98}
    budget: {max_samples: 60, max_rounds: 20, max_wall_s: 1200}
    evolvers:
      - {name: eoh, type: eoh, problem: tsp_construct, population_size: 4}
    schedule:
      - {evolver: eoh, every: 1}
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from coevo.backends.spec import ModelConfig
from coevo.errors import ConfigError, unknown_field_message
from coevo.evolvers.base import EvolverConfig, resolve_evolver
from coevo.placement import placement_errors
from coevo.schema import ConfigModel
from coevo.tracking import TrackingConfig

__all__ = [
    "ConfigError",
    "ModelConfig",
    "RunConfig",
    "apply_overrides",
    "check_combinations",
    "load_config",
    "parse_config",
]

#: model backends whose policies have weights ES can perturb (``Policy.has_parameters``; a test checks
#: that this agrees with the backend classes, which are not imported here because they load torch)
BACKENDS_WITH_WEIGHTS = ("hf", "vllm")


class _Strict(ConfigModel):
    model_config = ConfigDict(extra="forbid")


class RunSection(_Strict):
    name: str = Field("run", description="run name; the run folder is <out_dir>/<name>-<timestamp>")
    seed: int = Field(0, description="base seed of every random stream of the run")
    out_dir: str = Field("runs", description="folder that holds run folders")


class SamplingConfig(_Strict):
    max_new_tokens: int = Field(512, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    stop: list[str] = Field(
        default_factory=list,
        description="strings at which a completion is cut (removed), "
        "e.g. the closing code fence; honoured by the hf, openai and vllm backends",
    )


class BudgetConfig(_Strict):
    max_samples: int | None = Field(
        None, ge=1, description="max LLM samples over the run, failed and unparsable ones included"
    )
    max_rounds: int = Field(10, ge=1, description="max loop rounds")
    max_wall_s: float | None = Field(None, gt=0, description="wall-clock limit in seconds (summed over resumes)")


class ScheduleEntry(_Strict):
    evolver: str = Field(description="name of an evolver of this config")
    every: int = Field(1, ge=1, description="run at rounds start, start+every, ...")
    start: int = Field(0, ge=0, description="first round this evolver runs at")

    def due(self, round_index: int) -> bool:
        return round_index >= self.start and (round_index - self.start) % self.every == 0


class EvolverSpec(BaseModel):
    """``{name, type, **params}``; params are validated by the registered type's ``Config``."""

    model_config = ConfigDict(extra="allow")
    name: str
    type: str
    _params: EvolverConfig | None = PrivateAttr(None)

    @property
    def params(self) -> EvolverConfig:
        assert self._params is not None, "EvolverSpec not validated"
        return self._params

    def raw_params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ReportConfig(_Strict):
    plots: bool = True


class RunConfig(_Strict):
    plugins: list[str] = Field(
        default_factory=list, description="modules imported before types are resolved (user evolvers, rollouts)"
    )
    run: RunSection = Field(default_factory=RunSection)
    model: ModelConfig | None = Field(None, description="the policy; omit for runs without a model")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    evolvers: list[EvolverSpec] = Field(min_length=1)
    schedule: list[ScheduleEntry] | None = Field(
        None, description="order and cadence of evolver steps in a round; default: every evolver, every round"
    )
    report: ReportConfig = Field(default_factory=ReportConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="mirror metrics to trackers (off)")

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        names = [e.name for e in self.evolvers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"evolvers: duplicate names {sorted(dup)}")
        for entry in self.schedule or []:
            if entry.evolver not in names:
                raise ValueError(f"schedule: unknown evolver {entry.evolver!r}; evolvers are {names}")
        return self

    def resolved_schedule(self) -> list[ScheduleEntry]:
        return self.schedule or [ScheduleEntry(evolver=e.name) for e in self.evolvers]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside a field's annotation (``X``, ``X | None``, ``list[X]``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _sibling_fields(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The field names allowed beside ``loc[-1]``: those of the model that ``loc[:-1]`` leads to in ``model``."""
    for part in loc[:-1]:
        if model is None:
            return []
        if isinstance(part, int):  # a list item: the same model
            continue
        field = model.model_fields.get(str(part))
        model = _model_of(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _format_errors(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> list[str]:
    """One ``field.path: message`` line per pydantic error (``model``: the validated class, for the names an
    unknown field is compared with)."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "<config>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = unknown_field_message(str(err["loc"][-1]), _sibling_fields(model, tuple(err["loc"])))
        if err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")
            last = str(err["loc"][-1]) if err["loc"] else ""
            head = msg.split(": ", 1)[0]
            if last and " " not in head and (head == last or head.startswith(f"{last}.")):  # nested field-named
                lines.extend(f"{where[: -len(last)]}{part}" for part in msg.split("; "))
                continue
        lines.append(f"{where}: {msg}")
    return lines


#: the run folder's record of where each plug-in module was loaded from (:func:`plugin_origins`)
PLUGINS_FILE = "plugins.json"


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _import_root(name: str, file: Path) -> Path:
    """The ``sys.path`` folder from which module ``name`` (file ``file``) was imported."""
    root = file.parent.parent if file.name == "__init__.py" else file.parent
    for _ in range(name.count(".")):
        root = root.parent
    return root


def plugin_origins(cfg: RunConfig) -> dict[str, dict[str, str]]:
    """Where the config's plug-in modules were loaded from: module -> ``{"file": its file, "root": the folder on
    the import path it was found in}``, for the ``plugins`` modules, the modules of dotted-path ``type`` values
    (also nested ones, e.g. a rollout's) and the modules defining the evolver classes, leaving out coevo's own
    modules and modules not loaded. Saved as ``plugins.json`` in a new run's folder."""
    names = list(cfg.plugins)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            t = node.get("type")
            if isinstance(t, str) and (":" in t or "." in t):
                names.append(t.partition(":")[0] if ":" in t else t.rpartition(".")[0])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for spec in cfg.evolvers:
        walk({"type": spec.type, **spec.raw_params()})
        names.append(resolve_evolver(spec.type).__module__)
    package = Path(__file__).resolve().parent
    out: dict[str, dict[str, str]] = {}
    for name in dict.fromkeys(names):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or Path(file).resolve().is_relative_to(package):
            continue
        path = Path(file).resolve()
        out[name] = {"file": str(path), "root": str(_import_root(name, path))}
    return out


def read_plugin_origins(run_dir: str | Path) -> dict[str, dict[str, str]]:
    """A run folder's record of its plug-in modules (``plugins.json``, :func:`plugin_origins`); empty when there
    is none (a run without plug-ins, or made before coevo kept the record) or it cannot be read."""
    try:
        data = json.loads((Path(run_dir) / PLUGINS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def add_plugin_roots(origins: dict[str, dict[str, str]] | None) -> None:
    """Put on ``sys.path`` the recorded folder of every plug-in module (:func:`plugin_origins`) that cannot be
    imported from the current one (a run resumed or replayed from another folder) and whose file still exists."""
    for name, where in (origins or {}).items():
        root = where.get("root") if isinstance(where, dict) else None
        if not root or root in sys.path or name in sys.modules or _findable(name):
            continue
        if Path(where.get("file", "")).is_file():
            sys.path.append(root)


def import_hint(name: str, origins: dict[str, dict[str, str]] | None) -> str:
    """How to make plug-in module ``name`` importable, for an error line: the file the run loaded it from
    (recorded in ``plugins.json``) and the fix, else where Python looks for it."""
    top = name.split(".")[0]
    where = (origins or {}).get(name) or (origins or {}).get(top)
    if isinstance(where, dict) and where.get("file"):
        file, root = where["file"], where.get("root") or str(Path(where["file"]).parent)
        if Path(file).is_file():
            return f"; the run loaded it from {file}: set PYTHONPATH={root}"
        return (
            f"; the run loaded it from {file}, which no longer exists: put it back, or set PYTHONPATH to the "
            "folder that now holds it"
        )
    return f"; run from the folder that holds {top}.py or set PYTHONPATH=<that folder> (or install it as a package)"


def _current_folder_importable() -> None:
    """Put the current folder on ``sys.path`` (last), as ``python -m`` does: a user's plug-in module or a
    ``type: module:Class`` next to the config is found as the error hints say."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)


def import_plugins(modules: Any, origins: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Import the ``plugins`` modules (with the current folder on ``sys.path``, and the recorded folders of
    ``origins``, see :func:`add_plugin_roots`); returns field-named errors, each naming the fix."""
    if not isinstance(modules, list):
        return [] if modules is None else ["plugins: a list of module names"]
    errors = []
    _current_folder_importable()
    add_plugin_roots(origins)
    for i, name in enumerate(modules):
        if not isinstance(name, str) or not name:
            errors.append(f"plugins.{i}: a module name (e.g. mypkg.evolvers)")
            continue
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = getattr(exc, "name", None)
            hint = import_hint(name, origins) if missing and name.startswith(missing) else ""
            errors.append(f"plugins.{i}: cannot import {name!r} ({exc}){hint}")
    return errors


def _validate_evolvers(cfg: RunConfig, origins: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Validate each evolver's params with its type's Config; returns the errors (field-named).

    Types are resolved in an order that does not depend on the config's: dotted paths first (importing them
    may register names), then registered names."""
    errors: list[str] = []
    classes: dict[str, type] = {}
    if any(":" in s.type or "." in s.type for s in cfg.evolvers):
        _current_folder_importable()  # (parse_config has put the recorded plug-in folders on the path already)
    for spec in sorted(cfg.evolvers, key=lambda s: not (":" in s.type or "." in s.type)):
        try:
            classes[spec.name] = resolve_evolver(spec.type)
        except ValueError as exc:
            missing = getattr(exc.__cause__, "name", None) if isinstance(exc.__cause__, ImportError) else None
            errors.append(f"evolvers.{spec.name}.type: {exc}" + (import_hint(missing, origins) if missing else ""))
    for spec in cfg.evolvers:
        if spec.name not in classes:
            continue
        try:
            spec._params = classes[spec.name].Config.model_validate(spec.raw_params())
        except ValidationError as exc:
            errors.extend(_format_errors(exc, f"evolvers.{spec.name}.", classes[spec.name].Config))
    return errors


def parse_config(
    data: dict[str, Any],
    source: str = "<config>",
    overrides: list[str] | None = None,
    origins: dict[str, dict[str, str]] | None = None,
) -> RunConfig:
    """Validate a config mapping.

    Args:
        data: the mapping. source: the file it came from (named in errors). overrides: the ``--set
            A.B=VALUE`` items applied to it (:func:`apply_overrides`): an error of a field they set names the
            ``--set`` item instead of blaming ``source``. origins: where a run loaded its plug-in modules
            from (a run folder's ``plugins.json``, :func:`plugin_origins`): their folders join the import path
            when the modules cannot be found otherwise, and import errors name them.

    Raises:
        ConfigError: naming each invalid field (an unknown one with the nearest allowed name) and, for
            choices, the allowed values.
    """
    set_paths = override_paths(data, overrides or [])

    def fail(errors: list[str]) -> ConfigError:
        return ConfigError(_config_error_text(source, errors, set_paths))

    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a run config must be a YAML mapping, got {type(data).__name__}")
    add_plugin_roots(origins)
    plugin_errors = import_plugins(data.get("plugins"), origins)
    if plugin_errors:
        raise fail(plugin_errors)
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        errors = _format_errors(exc, model=RunConfig)
        evolver_errors = _evolver_errors_raw(data.get("evolvers"))
        raise fail(errors + evolver_errors) from None
    errors = _validate_evolvers(cfg, origins)
    for spec in cfg.evolvers if not errors else ():  # cross-evolver checks: EvolverConfig.link(name, cfg)
        errors += spec.params.link(spec.name, cfg)
    if not errors:
        errors = check_combinations(cfg)
    if errors:
        raise fail(errors)
    return cfg


def _config_error_text(source: str, errors: list[str], set_paths: dict[str, str]) -> str:
    """The ConfigError message: a head naming ``source`` (or, when every error is of a field set with
    ``--set``, the ``--set`` items), one indented line per error; a line about a field set with ``--set`` (its
    path, or a check of the enclosing section whose text names the field) ends with ``(from --set ITEM)``."""
    lines, from_set = [], 0
    for line in errors:
        field, _, said = line.partition(": ")
        items = [item for path, item in set_paths.items() if _error_is_of(field, said, path)]
        if items:
            from_set += 1
            line += f" (from --set {items[-1]})"
        lines.append(line)
    head = f"invalid run config {source}"
    if errors and from_set == len(errors):
        head = f"invalid --set value for run config {source}"
    return f"{head}:\n  " + "\n  ".join(lines)


def _error_is_of(field: str, said: str, path: str) -> bool:
    """Whether the error ``field: said`` is about the field at ``path``: the field itself or one below it, or a
    check of an enclosing section whose text names the field (``evolvers.es: population_size must be even``)."""
    if field == path or field.startswith(path + "."):
        return True
    leaf = path.rsplit(".", 1)[-1]
    return path.startswith(field + ".") and re.search(rf"(?<![\w.]){re.escape(leaf)}(?!\w)", said) is not None


def override_paths(data: dict[str, Any], overrides: list[str]) -> dict[str, str]:
    """``{field path as errors name it: --set item}`` for ``overrides`` applied to ``data``: evolvers
    addressed by index are named (``evolvers.0.sigma`` -> ``evolvers.es.sigma``). Malformed items are left
    out (:func:`apply_overrides` reports them)."""
    out: dict[str, str] = {}
    for item in overrides:
        path, _, _ = item.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if len(keys) >= 2 and keys[0] == "evolvers" and keys[1].lstrip("-").isdigit():
            evolvers = data.get("evolvers")
            try:
                keys[1] = str(evolvers[int(keys[1])]["name"])  # type: ignore[index]
            except (TypeError, IndexError, KeyError):
                pass
        if keys:
            out[".".join(keys)] = item
    return out


def _evolver_refs(node: Any, path: str) -> list[tuple[str, str | list[str]]]:
    """``(field path, NAME or [NAME, ...])`` for every ``evolver: NAME`` / ``evolvers: [NAME, ...]`` under ``node``."""
    out: list[tuple[str, str | list[str]]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}"
            if key == "evolver" and isinstance(value, str):
                out.append((where, value))
            elif key == "evolvers" and isinstance(value, list):
                out.append((where, [v for v in value if isinstance(v, str)]))
            else:
                out.extend(_evolver_refs(value, where))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_evolver_refs(value, f"{path}.{i}"))
    return out


def check_combinations(cfg: RunConfig) -> list[str]:
    """Errors for combinations of sections that cannot work (module docstring), each naming its fields.

    ``cfg`` must have validated evolver params (as :func:`parse_config` leaves it); returns [] when fine.
    """
    errors: list[str] = []
    names = [e.name for e in cfg.evolvers]
    backend = cfg.model.backend if cfg.model is not None else None
    for spec in cfg.evolvers:
        where = f"evolvers.{spec.name}"
        cls = resolve_evolver(spec.type)
        params = spec.params.model_dump()
        # (no model at all: the loop checks, as a policy may be passed to it in code)
        if cls.space == "parameter" and cfg.model is not None and backend not in (*BACKENDS_WITH_WEIGHTS, "auto"):
            errors.append(
                f"{where}.type / model.backend: {spec.type!r} evolves the model's weights (parameter "
                f"space), but backend {backend!r} has none; use model.backend "
                f"{' or '.join(BACKENDS_WITH_WEIGHTS)}, or a context-space evolver"
            )
        for field_path, refs in _evolver_refs(params, where):
            unknown = [r for r in refs if r not in names] if isinstance(refs, list) else refs not in names
            if unknown:
                shown = unknown if isinstance(refs, list) else repr(refs)
                errors.append(f"{field_path}: unknown {shown}; the evolvers of this config are {names}")
            elif spec.name in (refs if isinstance(refs, list) else [refs]):
                errors.append(f"{field_path}: {spec.name!r} refers to the evolver itself; name another evolver")
    return errors + placement_errors(cfg.evolvers, backend)


def _evolver_errors_raw(evolvers: Any) -> list[str]:
    """Evolver-section errors of a config whose top level is invalid too, so all are reported at once."""
    if not isinstance(evolvers, list):
        return []
    specs = []
    for item in evolvers:
        try:
            specs.append(EvolverSpec.model_validate(item))
        except ValidationError:
            continue
    stub = RunConfig.model_construct(evolvers=specs)
    return _validate_evolvers(stub)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses a mapping with the same key twice (PyYAML keeps the last one silently:
    ``budget: {max_rounds: 2, max_rounds: 5}`` would run 5 rounds)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping (the later one would win)", mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str) -> Any:
    """A run config's YAML text as Python objects (``yaml.safe_load``, but a key given twice in one mapping is a
    ``yaml.YAMLError``).

    Raises:
        yaml.YAMLError: not valid YAML, or a duplicate key.
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects


def yaml_error_line(path: str | Path, exc: yaml.YAMLError) -> str:
    """One line for a YAML syntax error of ``path``: ``PATH:LINE:COLUMN: not valid YAML: PROBLEM`` (1-based,
    where PyYAML knows the place)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    text = f"{context}, {problem}" if context else problem
    return f"{where}: not valid YAML: {' '.join(str(text).split())}"


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (value parsed as YAML) to a config mapping (returns a copy).

    List items are addressed by index (``evolvers.0.sigma=1e-3``) or, for ``evolvers``, by name
    (``evolvers.es.sigma=1e-3``).

    Raises:
        ConfigError: malformed override or a path that does not exist.
    """
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE")
        path, _, raw = item.partition("=")
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            raise ConfigError(f"--set {item!r}: empty key")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
            raise ConfigError(
                f"--set {item!r}: the value is not valid YAML ({problem}); quote it if it is text"
            ) from None
        node: Any = data
        for i, key in enumerate(keys):
            last = i == len(keys) - 1
            if isinstance(node, list):
                idx = _list_index(node, key, item)
                if last:
                    node[idx] = value
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if last:
                    node[key] = value
                else:
                    node = node.setdefault(key, {})
            else:
                raise ConfigError(f"--set {item!r}: {'.'.join(keys[:i])} is not a mapping or list")
    return data


def _list_index(node: list, key: str, item: str) -> int:
    if key.lstrip("-").isdigit():
        idx = int(key)
        if not -len(node) <= idx < len(node):
            raise ConfigError(f"--set {item!r}: index {idx} out of range (list has {len(node)} items)")
        return idx
    for idx, elem in enumerate(node):
        if isinstance(elem, dict) and elem.get("name") == key:
            return idx
    raise ConfigError(f"--set {item!r}: no list item named {key!r}")


def load_config(
    path: str | Path, overrides: list[str] | None = None, plugins: list[str] | None = None
) -> tuple[RunConfig, dict[str, Any]]:
    """Read, override and validate a YAML run config; ``plugins`` are appended to its ``plugins`` list.

    Returns:
        (validated config, the resolved mapping to save in the run folder).

    Raises:
        ConfigError: missing file, YAML syntax error, or invalid fields.
    """
    path = Path(path)
    if path.is_dir():
        found = sorted((p.relative_to(path) for p in path.rglob("*.yaml")), key=lambda p: (len(p.parts), str(p)))
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        hint = f"; configs in it: {', '.join(map(str, found[:8]))}{more}" if found else ""
        raise ConfigError(f"{path} is a folder, not a run config file (give a .yaml file{hint})")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = load_yaml_text(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(path, exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc})") from None
    if isinstance(data, dict) and "grpo" in data and "evolvers" not in data:  # a shipped configs/longhorizon file
        raise ConfigError(
            f"{path} is a config of the GRPO baseline (top-level 'grpo:'), not of `coevo run`; run it with: "
            f"python -m coevo.rl.grpo {path} --out DIR"
        )
    data = apply_overrides(data, overrides or [])
    if plugins:
        if not isinstance(data.get("plugins", []), list):
            raise ConfigError(f"{path}: plugins must be a list of module names")
        data["plugins"] = list(dict.fromkeys([*data.get("plugins", []), *plugins]))
    return parse_config(data, str(path), overrides), data
