"""The base of every config model (:class:`ConfigModel`): the pydantic models a run config's sections, evolvers,
rollouts, trainers and backends are validated with.

What it adds to pydantic: **no boolean where a number goes**. Pydantic's lax mode turns ``True`` into ``1`` for
an ``int`` or ``float`` field, and YAML 1.1 reads ``yes``, ``no``, ``on``, ``off``, ``true`` and ``false`` as
booleans, so ``population_size: on`` or ``--set budget.max_samples=true`` used to run with 1 silently. Now such a
value is refused with the field named (``population_size: a boolean (True) where a number goes``), whatever
the config section. Fields that accept a boolean (``bool``, ``bool | int``) are unchanged.

Each subclass still sets ``model_config`` (``extra="forbid"`` for config sections).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator


def _takes_number_not_bool(annotation: Any) -> bool:
    """Whether a field annotated ``annotation`` takes an int or float and no bool (unions and Optional looked
    into; ``Annotated`` is already unwrapped by pydantic)."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        return bool not in args and any(a in (int, float) for a in args)
    return False


class ConfigModel(BaseModel):
    """A pydantic model for config input that refuses booleans for numeric fields (module docstring).

    Raises (on validation): pydantic.ValidationError naming the field."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _takes_number_not_bool(field.annotation):
                raise ValueError(f"a boolean ({value}) where a number goes")
        return value
