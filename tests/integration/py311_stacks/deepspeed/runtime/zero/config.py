"""Test double (see ../../../README.md): deepspeed.runtime.zero.config.ZeroStageEnum, whose
member ZeRO-1/2 stores as optimizer_state_dict['zero_stage']."""
from enum import Enum


class ZeroStageEnum(int, Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3  # an alias of weights
