"""Test double (see ../../README.md): the str-mixin Enum base of transformers' option enums."""
from enum import Enum


class ExplicitEnum(str, Enum):
    @classmethod
    def _missing_(cls, value):
        raise ValueError(f"{value!r} is not one of {[m.value for m in cls]}")
