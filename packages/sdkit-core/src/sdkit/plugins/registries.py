"""Registries handed to the registration hooks. They record which plugin added what, so a
duplicate name is rejected naming both plugins.

``registry.add`` takes a class or a ``"module:attr"`` reference to one. A reference is imported
when it is added, inside the registering plugin's own try/except (a bad reference drops that
plugin, like any failing hook), so a hook module can name classes in modules it must not import
itself: core's built-in plugin sits below the pipelines it registers loaders from, and a
third-party hook module stays import-light.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from sdkit.backend import Backend
from sdkit.errors import DuplicateNameError

if TYPE_CHECKING:
    from sdkit.families.family import Family


def import_object(reference: str) -> Any:
    """The object a ``"package.module:attr"`` reference names (``attr`` may be dotted)."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a registry reference is written 'module:attr', not {reference!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> class, with the plugin that registered each name."""

    kind = "item"

    def __init__(self) -> None:
        self._items: dict[str, type[T]] = {}
        self._owners: dict[str, str] = {}
        self._aliases: dict[str, str] = {}
        self.current_plugin = "<unknown>"

    def add(self, cls: type[T] | str) -> type[T]:
        """Register ``cls`` (a class, or ``"module:attr"`` naming one) under ``cls.name`` and
        ``cls.aliases`` if it has any. Returns the class."""
        if isinstance(cls, str):
            cls = cast("type[T]", import_object(cls))
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls!r} has no 'name' string attribute")
        aliases: Iterable[str] = getattr(cls, "aliases", ())
        for key in (name, *aliases):
            owner = self._owners.get(key) or self._owners.get(self._aliases.get(key, ""))
            if owner is not None:
                raise DuplicateNameError(
                    f"{self.kind} name {key!r} is registered by both plugin {owner!r} "
                    f"and plugin {self.current_plugin!r}"
                )
        self._items[name] = cls
        self._owners[name] = self.current_plugin
        for alias in aliases:
            self._aliases[alias] = name
        return cls

    def names(self) -> list[str]:
        return list(self._items)

    def resolve(self, name: str) -> str | None:
        """Canonical name for ``name`` or one of its aliases (case-insensitive)."""
        if name in self._items:
            return name
        if name in self._aliases:
            return self._aliases[name]
        lowered = name.lower()
        for key in (*self._items, *self._aliases):
            if key.lower() == lowered:
                return self._aliases.get(key, key)
        return None

    def get(self, name: str) -> type[T] | None:
        canonical = self.resolve(name)
        return self._items[canonical] if canonical else None

    def owner(self, name: str) -> str:
        return self._owners[name]

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    def drop_plugin(self, plugin: str) -> None:
        """Forget everything a (failed) plugin registered."""
        for name in [n for n, o in self._owners.items() if o == plugin]:
            del self._items[name], self._owners[name]
            for alias in [a for a, n in self._aliases.items() if n == name]:
                del self._aliases[alias]

    def items(self) -> list[tuple[str, type[T]]]:
        return list(self._items.items())


class BackendRegistry(Registry[Backend]):
    kind = "backend"


class LoaderRegistry(Registry[Any]):
    kind = "model loader"


class SchedulerRegistry(Registry[Any]):
    kind = "scheduler"


class FamilyRegistry(Registry[Any]):
    """Model families by name: ``sdkit.families.Family`` objects (not classes), or
    ``"module:attr"`` references to them. ``families()`` lists them for detection."""

    kind = "model family"

    def add(self, cls: Any) -> Any:
        from sdkit.families.family import Family

        family = import_object(cls) if isinstance(cls, str) else cls
        if not isinstance(family, Family):
            raise TypeError(f"{cls!r} is not a sdkit.families.Family")
        return super().add(cast("Any", family))

    def family(self, name: str) -> Family | None:
        return cast("Family | None", self.get(name))

    def families(self) -> list[Family]:
        """Every registered family, the highest ``priority`` first (then in registration order)."""
        found = [cast("Family", family) for _, family in self.items()]
        return sorted(found, key=lambda family: -family.priority)
