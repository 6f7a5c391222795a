from .generic import ExplicitEnum  # noqa: F401
