"""Test double (see ../../README.md): the dataclass ZeRO-1/2 stores in
optimizer_state_dict['param_slice_mappings']."""
from dataclasses import dataclass


@dataclass
class fragment_address:
    numel: int
    start: int
