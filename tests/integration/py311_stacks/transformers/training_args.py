"""Test double (see ../README.md): OptimizerNames (a subset of its members) and a
TrainingArguments dataclass with a subset of the real fields, whose __post_init__ turns the
option strings into enum members as the real one does. Trainer saves it with
torch.save(self.args, "training_args.bin"): GLOBAL, EMPTY_TUPLE, NEWOBJ, BUILD(__dict__)."""
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Union

import torch

from .debug_utils import DebugOption
from .trainer_utils import HubStrategy, IntervalStrategy, SaveStrategy, SchedulerType
from .utils import ExplicitEnum


class OptimizerNames(ExplicitEnum):
    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_8BIT = "adamw_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    RMSPROP = "rmsprop"


@dataclass
class TrainingArguments:
    framework = "pt"
    output_dir: Optional[str] = None
    overwrite_output_dir: bool = False
    do_train: bool = False
    do_eval: bool = False
    eval_strategy: Union[IntervalStrategy, str] = "no"
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    num_train_epochs: float = 3.0
    max_steps: int = -1
    lr_scheduler_type: Union[SchedulerType, str] = "linear"
    lr_scheduler_kwargs: Union[dict, str] = field(default_factory=dict)
    warmup_steps: int = 0
    logging_dir: Optional[str] = None
    logging_strategy: Union[IntervalStrategy, str] = "steps"
    logging_steps: float = 500
    save_strategy: Union[SaveStrategy, str] = "steps"
    save_steps: float = 500
    save_total_limit: Optional[int] = None
    seed: int = 42
    bf16: bool = False
    fp16: bool = False
    debug: Union[str, list] = ""
    optim: Union[OptimizerNames, str] = "adamw_torch"
    report_to: Union[None, str, list] = None
    hub_strategy: Union[HubStrategy, str] = "every_save"

    def __post_init__(self):
        if self.logging_dir is None and self.output_dir is not None:
            self.logging_dir = self.output_dir + "/runs"
        self.eval_strategy = IntervalStrategy(self.eval_strategy)
        self.logging_strategy = IntervalStrategy(self.logging_strategy)
        self.save_strategy = SaveStrategy(self.save_strategy)
        self.hub_strategy = HubStrategy(self.hub_strategy)
        self.lr_scheduler_type = SchedulerType(self.lr_scheduler_type)
        self.optim = OptimizerNames(self.optim)
        if isinstance(self.debug, str):
            self.debug = [DebugOption(s) for s in self.debug.split()]
        if self.report_to is None:
            self.report_to = []

    # The real property sets up the process group and caches the device in __dict__, which is
    # how a torch.device ends up in training_args.bin.
    @cached_property
    def _setup_devices(self):
        self._n_gpu = 0
        return torch.device("cpu")

    @property
    def device(self):
        return self._setup_devices
