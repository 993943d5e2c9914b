"""``--config FILE`` for a command: its options read from a TOML file.

Strategy: nothing here names an option. The file's keys are the command's own click
parameters (``max-frame-bytes`` or ``max_frame_bytes``), checked and converted by each
parameter's type, then handed to click as the context's ``default_map``: click's order
of precedence does the rest (the command line, then environment variables, then the
file, then the defaults). An option added to the command later is a key of the file at
once. ``--print-config`` prints the settings a start would use, as a file that loads back.
"""

import difflib
import functools
import json
import os
import tomllib

import click

__all__ = ["config_file_options", "load", "to_toml", "given", "origin", "CONFIG_ENV"]

CONFIG_ENV = "SHMQ_CONFIG"
_PRINT = "shmq.print_config"
_FILE = "shmq.config_file"  # ctx.meta: the --config file read, for ``origin``
_OWN = ("config", "print_config", "help")  # parameters that are not settings
_HIDDEN = ("token",)  # printed as a comment, never in clear


def _settings(command: click.Command) -> dict[str, click.Parameter]:
    """The command's options by every name a file may use: each long option without its
    dashes (dashes or underscores) and the parameter's own name."""
    out = {}
    for p in command.params:
        if not isinstance(p, click.Option) or p.name in _OWN or not p.expose_value:
            continue
        for name in [p.name, *(o.lstrip("-") for o in p.opts if o.startswith("--"))]:
            out[name.replace("-", "_")] = p
    return out


def _kind_error(p: click.Parameter, value) -> str | None:
    """Why a TOML value cannot be ``p``'s, else None (click's type checks the rest)."""
    if isinstance(value, dict):
        return "a table is not a setting"
    if p.multiple or p.nargs != 1:
        if not isinstance(value, list):
            return "takes a list"
        return next((_kind_error_one(p, v) for v in value if _kind_error_one(p, v)), None)
    if isinstance(value, list):
        return "takes one value, not a list"
    return _kind_error_one(p, value)


def _kind_error_one(p, value) -> str | None:
    if getattr(p, "is_flag", False) and not getattr(p, "count", False):
        return None if isinstance(value, bool) else "takes true or false"
    if isinstance(value, bool):
        return f"{json.dumps(value)} is for on/off options; this one takes a value ({p.type.name})"
    if not isinstance(value, (str, int, float)):
        return f"a TOML {type(value).__name__} is not a value for it ({p.type.name})"
    return None


def load(path: str, command: click.Command, ctx: click.Context) -> dict:
    """The settings in the TOML file at ``path`` for ``command``: {parameter name: value},
    each converted by its parameter's type; a relative path is taken from the file's
    directory. click.UsageError (one line naming the file and the key) for a file that
    cannot be read or parsed, an unknown key, a bad value."""
    where = f"config file {path}"
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise click.UsageError(f"{where}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise click.UsageError(f"{where}: not TOML: {e}") from None
    known, out, base = _settings(command), {}, os.path.dirname(os.path.abspath(path))
    for key, value in data.items():
        p = known.get(key.replace("-", "_"))
        if p is None:
            raise click.UsageError(f"{where}: unknown key {key!r}{_did_you_mean(key, known)} (the keys are the "
                                   f"command's options: {_example(known)})")
        if p.name in out:
            raise click.UsageError(f"{where}: key {key!r} given twice (as dashes and as underscores)")
        why = _kind_error(p, value)
        if why is None:
            if isinstance(p.type, click.Path) and isinstance(value, str) and value:
                value = os.path.join(base, os.path.expanduser(value))
            try:
                value = p.type_cast_value(ctx, value)
            except click.BadParameter as e:
                why = e.message.rstrip(".")
        if why is not None:
            raise click.UsageError(f"{where}: key {key!r}: {why}")
        out[p.name] = value
    return out


def _did_you_mean(key: str, known) -> str:
    """``: did you mean 'port'?`` for a misspelt key, in the key's own spelling (dashes or
    underscores); else nothing."""
    sep = "_" if "_" in key and "-" not in key else "-"
    names = {name.replace("_", sep) for name in known}
    close = difflib.get_close_matches(key.lower().replace("_" if sep == "-" else "-", sep), names, n=1)
    return f": did you mean {close[0]!r}?" if close else ""


def _example(known) -> str:
    names = list(dict.fromkeys(p.name.replace("_", "-") for p in known.values()))
    return ", ".join(names[:3]) + ("..." if len(names) > 3 else "")


def given(name: str) -> bool:
    """Whether the current command's ``name`` was given at all: on the command line, in the
    environment or in the config file (not its default)."""
    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def origin(name: str) -> str:
    """What set the current command's option ``name``, in words for a message: ``--port``,
    ``$SHMQ_LOOP``, ``key 'port' of config file FILE``, ``the default of --port``."""
    ctx = click.get_current_context()
    p = next(p for p in ctx.command.params if p.name == name)
    flag = next((o for o in p.opts if o.startswith("--")), p.name)
    source = ctx.get_parameter_source(name)
    if source == click.core.ParameterSource.DEFAULT_MAP:
        return f"key {flag[2:]!r} of config file {ctx.meta.get(_FILE)}"
    if source == click.core.ParameterSource.ENVIRONMENT:
        return f"${p.envvar}"
    if source == click.core.ParameterSource.DEFAULT:
        return f"the default of {flag}"
    return flag


def _use_file(ctx, _param, path):
    if path:
        ctx.default_map = {**(ctx.default_map or {}), **load(path, ctx.command, ctx)}
        ctx.meta[_FILE] = path


def _ask_print(ctx, _param, value):
    if value:
        ctx.meta[_PRINT] = True


def config_file_options(f):
    """Give a click command ``--config FILE`` (default ``$SHMQ_CONFIG``) and
    ``--print-config``; put it right under the command's decorator (above its options)."""
    @functools.wraps(f)
    def command(**settings):
        ctx = click.get_current_context()
        if ctx.meta.get(_PRINT):
            click.echo(to_toml(settings, ctx), nl=False)
            return None
        return f(**settings)

    command = click.option(
        "--print-config", is_flag=True, is_eager=True, expose_value=False, callback=_ask_print,
        help="Print the settings this start would use (command line, environment, --config file, defaults) "
             "as a config file, and exit.")(command)
    return click.option(
        "--config", type=click.Path(dir_okay=False), envvar=CONFIG_ENV, is_eager=True, expose_value=False,
        callback=_use_file, metavar="FILE",
        help="Read options from this TOML file: keys are the options' names (max-frame-bytes = \"16MiB\", "
             "no-persist = true); the command line and environment variables win. Also $SHMQ_CONFIG.")(command)


def to_toml(settings: dict, ctx: click.Context) -> str:
    """``settings`` (parameter name: value) as TOML, the options' order, one line each; a
    value left unset (None) and the token are comments."""
    lines = []
    for p in ctx.command.params:
        if p.name not in settings:
            continue
        key, value = p.name.replace("_", "-"), settings[p.name]
        note = _SOURCES.get(ctx.get_parameter_source(p.name), "")
        if isinstance(p.type, click.Path) and isinstance(value, str):
            value = os.path.abspath(value)  # the file may be read from another directory
        if value is None or (isinstance(value, (tuple, list)) and not value):
            lines.append(f"# {key}: not set (its default)")
        elif p.name in _HIDDEN:
            lines.append(f"# {key}: set, not shown{note}")
        else:
            lines.append(f"{key} = {_value(value)}{note}")
    return "\n".join(lines) + "\n"


_SOURCES = {click.core.ParameterSource.COMMANDLINE: "  # command line",
            click.core.ParameterSource.ENVIRONMENT: "  # environment",
            click.core.ParameterSource.DEFAULT_MAP: "  # config file"}


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False).replace("\x7f", "\\u007f")  # a TOML basic string
