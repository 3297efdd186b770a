"""Change what one module's `__call__` does without wrapping it: the module gets a subclass of
its own class, so its parameters, module names, cache handling and isinstance checks stay as
they were (a wrapper would add a level to every name under it)."""

from __future__ import annotations

from typing import Callable, Dict, Tuple

_SUBCLASSES: Dict[Tuple[type, str], type] = {}


def override_call(module, call: Callable, marker: str) -> None:
    """Make `module.__call__(*a, **kw)` run `call(module, original_call, *a, **kw)`.

    One subclass per (class, marker); a module that already carries `marker` is left alone, so
    calling this again is a no-op."""
    cls = type(module)
    if getattr(cls, marker, False):
        return
    sub = _SUBCLASSES.get((cls, marker))
    if sub is None:
        def __call__(self, *args, **kwargs):
            return call(self, super(sub, self).__call__, *args, **kwargs)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, marker: True,
                                          "__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _SUBCLASSES[(cls, marker)] = sub
    module.__class__ = sub
