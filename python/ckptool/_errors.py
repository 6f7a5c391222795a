"""The exceptions every ckptool function raises: each carries the path it was given and the
reason, as the command line prints them."""
from __future__ import annotations

from typing import Optional


class Error(Exception):
    """A checkpoint could not be read or a job failed. `path` is what it was about (or None),
    `reason` the explanation without the path; str(error) is ckptool's whole message."""

    def __init__(self, message: str, path: Optional[str] = None, reason: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.path = path
        if reason is None:
            reason = message
            if path and message.startswith(path + ": "):
                reason = message[len(path) + 2:]
        self.reason = reason


class UsageError(Error, ValueError):
    """Arguments ckptool refuses (an unknown option, a missing output...): exit code 2."""


class CheckpointError(Error):
    """A checkpoint is unreadable, corrupt, or not what the call needs."""


class JobFailed(Error):
    """A job ran and failed, or found problems (the command's exit code 1). `result` holds
    its report when it printed one."""

    def __init__(self, message: str, path: Optional[str] = None, result=None):
        super().__init__(message, path)
        self.result = result
