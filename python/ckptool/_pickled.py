"""Inert records of what a pickle would have imported or built: ckptool.load returns these for
anything outside the reviewed allowlist and the caller's trust, instead of running it."""
from __future__ import annotations

from typing import Any, Optional


class Pickled:
    """An object the pickle would make by importing `module`.`name` and (if `called`)
    calling it with `args`/`kwargs`, then giving it `state` (BUILD), `items` (APPEND) and
    `pairs` (SETITEM). Nothing of it was imported or run. `callable` holds what was called
    when that was not an imported name (name is then "<computed>")."""

    __slots__ = ("module", "name", "called", "args", "kwargs", "state", "items", "pairs",
                 "callable")

    def __init__(self, module: str, name: str, called: bool):
        self.module = module
        self.name = name
        self.called = called
        self.args: tuple = ()
        self.kwargs: Optional[dict] = None
        self.state: Any = None
        self.items: Optional[list] = None
        self.pairs: Optional[list] = None
        self.callable: Any = None

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}" if self.module else self.name

    def __repr__(self) -> str:
        if not self.called:
            return f"<ckptool.Pickled global {self.qualname}>"
        parts = [repr(a) for a in self.args][:4]
        if len(self.args) > 4:
            parts.append("...")
        more = " with state" if self.state is not None else ""
        return f"<ckptool.Pickled {self.qualname}({', '.join(parts)}){more}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pickled):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # mutable, like the objects it stands for
