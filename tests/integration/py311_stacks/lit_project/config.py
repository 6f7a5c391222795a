# A Lightning user's config enums: LightningModule.save_hyperparameters() keeps them as given,
# and the checkpoint stores dict(model.hparams) under "hyper_parameters".
from enum import Enum, IntEnum


class Activation(str, Enum):
    GELU = "gelu"
    RELU = "relu"
    SILU = "silu"


class NormKind(Enum):
    LAYER = "layer"
    RMS = "rms"


class Precision(IntEnum):
    FP32 = 32
    BF16 = 16
