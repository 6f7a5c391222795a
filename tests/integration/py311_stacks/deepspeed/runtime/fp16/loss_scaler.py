"""Test double (see ../../../README.md): the loss scalers ZeRO-1/2 stores as
optimizer_state_dict['loss_scaler']. Only what decides how an instance pickles: the class
path and the instance attributes, set in the order DeepSpeed sets them."""
import torch

from deepspeed.runtime.config_utils import DeepSpeedConfigObject


class LossScalerBase(DeepSpeedConfigObject):
    def __init__(self, cur_scale):
        self.cur_scale = cur_scale
        self.dynamic = False


class LossScaler(LossScalerBase):
    def __init__(self, scale=1):
        super().__init__(scale)


class DynamicLossScaler(LossScalerBase):
    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis,
                 raise_error_at_min_scale=True, dtype=torch.half):
        super().__init__(init_scale)
        for name, value in (("cur_iter", 0), ("last_overflow_iter", -1), ("scale_factor", 2.0),
                            ("scale_window", scale_window), ("min_scale", min_scale),
                            ("delayed_shift", delayed_shift), ("cur_hysteresis", delayed_shift),
                            ("consecutive_hysteresis", consecutive_hysteresis),
                            ("raise_error_at_min_scale", raise_error_at_min_scale), ("dynamic", True),
                            ("dtype", dtype)):
            setattr(self, name, value)
