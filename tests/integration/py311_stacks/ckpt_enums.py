"""Every kind of Enum, and containers that hold members the way real checkpoints do."""
import enum
from dataclasses import dataclass, field


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2
    BLUE = 3


class Mode(str, enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


class Kind(enum.Enum):
    LINEAR = 1
    CONV = (3, 3)


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


class Access(enum.IntFlag):
    READ = 1
    WRITE = 2


@dataclass
class RunConfig:
    mode: Mode = Mode.TRAIN
    color: Color = Color.GREEN
    kinds: list = field(default_factory=lambda: [Kind.LINEAR, Kind.CONV])
    perm: Perm = Perm.R
    lr: float = 3e-4


class PlainState:
    """An ordinary object: pickled as NEWOBJ (copyreg.__newobj__) + BUILD with its __dict__."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)
