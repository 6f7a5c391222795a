"""Test double (see ../../README.md): the base class of DeepSpeed's loss scalers."""


class DeepSpeedConfigObject:
    def __repr__(self):
        return f"{type(self).__name__}({vars(self)})"
