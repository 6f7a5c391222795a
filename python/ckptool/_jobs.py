"""Every ckptool command as a function: the command line's own code runs in this process
(ckptool._core.run), so options and behaviour are exactly the CLI's. Keyword arguments are its
options (output_dir="x" is --output-dir x, force=True is --force, patterns=["a", "b"] is
--patterns a b); the result is its --json report. A job runs on a thread of its own with the GIL
released (jobs in several threads run at once); what it says comes back in the Result and as
warnings, never through the process's stdout or stderr; Ctrl-C stops it, removes what it had
started to write and raises KeyboardInterrupt."""
from __future__ import annotations

import difflib
import inspect as _inspect
import json
import os
import re
import warnings
from typing import Any, Callable, Iterable, List, Optional

from . import _core
from ._errors import CheckpointError, Error, JobFailed, UsageError

ProgressCallback = Callable[[str, int, int, int], None]


class CheckpointWarning(UserWarning):
    """What a command warned about (a conversion that lost precision, a file left behind)."""


class Result:
    """What a job did: `report` is its JSON report (a dict, or a list for commands that print
    one object per action); its keys also read as attributes (result.files). `ok` is False
    when verify or inspect found problems; `warnings` the command's warnings."""

    def __init__(self, command: str, exit_code: int, report: Any, warnings_: List[str],
                 text: str):
        self.command = command
        self.exit_code = exit_code
        self.ok = exit_code == 0
        self.report = report
        self.warnings = warnings_
        self.text = text

    def __getitem__(self, key):
        return self.report[key]

    def __getattr__(self, name: str):
        report = self.__dict__.get("report")
        if isinstance(report, dict) and name in report:
            return report[name]
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<ckptool.Result {self.command} ok={self.ok}>"


def _flag(key: str) -> str:
    return ("-" if len(key) == 1 else "--") + key.replace("_", "-")


def _args(command: str, paths: Iterable[Any], options: dict) -> List[str]:
    args = [command] + [os.fspath(p) for p in paths]
    for key, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            args.append(_flag(key))
        elif isinstance(value, (list, tuple)):
            args.append(_flag(key))
            args.extend(os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in value)
        else:
            args += [_flag(key), os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    if "--json" not in args:
        args.append("--json")
    return args


def _report(stdout: str) -> Any:
    text = stdout.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        try:
            return [json.loads(ln) for ln in lines]  # one object per line (apply, watch)
        except ValueError:
            return None


# Exit 1 means "found problems" (latest: "found none"): a result, not an error.
_REPORTS_PROBLEMS = {"verify", "inspect", "latest"}


def run(command: str, *paths: Any, progress: Optional[ProgressCallback] = None,
        **options: Any) -> Result:
    """Runs `ckptool COMMAND PATHS... --OPTIONS` in this process and returns its Result;
    raises UsageError (exit 2) or JobFailed (exit 1; verify and inspect return a Result with
    ok=False instead when they found problems)."""
    rc, out, err, errs, warns = _core.run(_args(command, paths, options), progress)
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    errors = [e.decode("utf-8", "replace") for e in errs]
    warns = [w.decode("utf-8", "replace") for w in warns]
    for w in warns:
        warnings.warn(w, CheckpointWarning, stacklevel=3)
    report = _report(stdout)
    result = Result(command, rc, report, warns, stdout)
    first = os.fspath(paths[0]) if paths else None
    if rc == 0 or (rc == 1 and command in _REPORTS_PROBLEMS and report is not None):
        return result
    message = "; ".join(errors) or stderr.strip() or f"ckptool {command} exited with {rc}"
    if rc == 2:
        unknown = _unknown_keyword(command, errors, options)
        if unknown:
            raise TypeError(unknown)
        raise UsageError(message, first)
    if rc == 1:
        raise JobFailed(message, first, result)
    raise Error(message, first)


_UNKNOWN = re.compile(r"^unknown option (\S+)(?: \(did you mean (\S+)\?\))?")


def _unknown_keyword(command: str, errors: List[str], options: dict) -> Optional[str]:
    """The command line names an option the command does not have, and it came from a keyword
    argument: said as Python says it of any function (the command ran nothing)."""
    m = _UNKNOWN.match(errors[0]) if errors else None
    if not m:
        return None
    key = next((k for k in options if _flag(k) == m.group(1)), None)
    if key is None:
        return None
    hint = ""
    if m.group(2) and m.group(2).startswith("--"):
        hint = f" (did you mean {m.group(2)[2:].replace('-', '_')!r}?)"
    return f"ckptool.{command}() got an unexpected keyword argument {key!r}{hint}"


def _help(command: str) -> str:
    rc, out = _core.run(["help", command])[:2]
    return out.decode("utf-8", "replace") if rc == 0 else ""


# What a keyword argument of each kind of option takes (the stubs say the same).
_ANNOTATIONS = {"flag": "bool", "multi": "Sequence[Union[str, os.PathLike[str]]]",
                "int": "int", "float": "float", "str": "Union[str, os.PathLike[str]]"}


def _kind(option: dict) -> str:
    if option["flag"]:
        return "flag"
    if option["multi"]:
        return "multi"
    t = option["type"].split(":")[0].strip()
    if t in ("INT", "UINT"):
        return "int"
    if t == "FLOAT":
        return "float"
    return "str"


def _options(command: str) -> List[dict]:
    """The keyword arguments of a job: the command's options, each under its every long name
    (export's output= and to=); its JSON report is the Result, so --json is always given."""
    out, seen = [], set()
    for o in _core.command_options(command):
        for name in o["names"]:  # --checkpoint_dir and --checkpoint-dir are one keyword
            if name != "json" and name not in seen:
                seen.add(name)
                out.append(dict(o, name=name))
    return out


def _signature(command: str) -> _inspect.Signature:
    P = _inspect.Parameter
    params = [P("paths", P.VAR_POSITIONAL, annotation="Union[str, os.PathLike[str]]"),
              P("progress", P.KEYWORD_ONLY, default=None,
                annotation="Optional[ProgressCallback]")]
    for o in _options(command):
        params.append(P(o["name"], P.KEYWORD_ONLY, default=None,
                        annotation=f"Optional[{_ANNOTATIONS[_kind(o)]}]"))
    return _inspect.Signature(params, return_annotation="Result")


def _make(command: str, what: str) -> Callable[..., Result]:
    sig = _signature(command)
    known = [p for p in sig.parameters if p != "paths"]

    def job(*paths: Any, progress: Optional[ProgressCallback] = None, **options: Any) -> Result:
        for key in options:
            if key not in sig.parameters or key == "paths":
                near = difflib.get_close_matches(key, known, n=1)
                raise TypeError(f"ckptool.{command}() got an unexpected keyword argument "
                                f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        return run(command, *paths, progress=progress, **options)

    job.__name__ = job.__qualname__ = command
    job.__signature__ = sig  # help(), inspect and IDEs show the command's own options
    lines = [f"  {o['name']}: {o['help']}" for o in _options(command)]
    job.__doc__ = (
        f"{what}\n\nRuns `ckptool {command}` in this process: each keyword argument is the "
        f"option of the same name (output_dir='x' is --output-dir x, force=True is --force, a "
        f"list gives several values); `progress`, if given, is called as progress(label, "
        f"files_done, bytes_done, bytes_total) while it runs. Returns a ckptool.Result (its "
        f"JSON report); raises ckptool.UsageError or ckptool.JobFailed, and TypeError for a "
        f"keyword the command does not have.\n\nKeyword arguments:\n" + "\n".join(lines) +
        f"\n\nThe command line's help:\n\n{_help(command)}")
    return job


# The commands and their help come from the CLI's own table (cli/command_table.h); `watch`
# runs until it is stopped, so it is no job here (the trainer integrations apply the policy as
# checkpoints land).
_COMMANDS = dict(_core.commands())
_NOT_JOBS = {"watch", "latest"}  # latest: a function of its own, below


def _job(command: str, more: str = "") -> Callable[..., Result]:
    return _make(command, _COMMANDS[command] + (". " + more if more else "."))


inspect = _job("inspect")
verify = _job("verify", "result.ok is False on any problem")
shrink = _job("shrink")
convert = _job("convert", "Training state is kept")
strip = _job("strip")
export = _job("export")
compress = _job("compress")
decompress = _job("decompress")
prune = _job("prune", "A dry run unless yes=True")
apply = _job("apply")
manifest = _job("manifest", "The checkpoint must verify first; docs/manifest.md")
reshard = _job("reshard", "to='universal' writes DeepSpeed's universal checkpoint; then load it "
               "with \"checkpoint\": {\"load_universal\": true} on any number of ranks; "
               "docs/reshard.md")

JOBS = [n for n, _ in _core.commands() if n not in _NOT_JOBS]  # in the CLI's order


def latest(root: Any, *, threads: Optional[int] = None, structure: bool = False) -> Optional[str]:
    """The path of the newest checkpoint under `root` (by the step in its name) that is complete
    and verifies, or None when there is none: `ckptool latest ROOT`. Why newer ones were passed
    over: ckptool.run("latest", root).report["skipped"]. `structure=True` reads no data byte
    (a cut or missing file is seen, a flipped bit is not). Resume from it:

        trainer.train(resume_from_checkpoint=ckptool.latest("out"))        # transformers
        trainer.fit(model, ckpt_path=ckptool.latest("checkpoints"))        # Lightning
        p = ckptool.latest("ckpt"); engine.load_checkpoint("ckpt", tag=os.path.basename(p))
                                                                           # DeepSpeed
    """
    return run("latest", root, threads=threads, structure=structure).report["latest"]

__all__ = ["run", "Result", "CheckpointWarning", "latest", "reshard", "inspect", "verify", "shrink",
           "convert", "strip", "export", "compress", "decompress", "prune", "apply", "manifest",
           "CheckpointError"]
