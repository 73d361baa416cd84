"""One declaration per setting, read from flags, the environment and a settings file alike.

A role's settings are one pydantic model. Each field is a setting: its name, type, default and
checks are the field's, and a :class:`Setting` in its ``Annotated`` metadata says how a person
gives it — the help text, the ``--help`` group, and where that differs from the rule, the flag
(``--<field-name>``) and the environment variable (``FABRIC_DRA_<FIELD_NAME>``). Everything else is
derived from that declaration: :func:`add_settings_arguments` adds the options to an argparse
parser (``--help`` names each variable and default), :func:`read_settings` gathers the values and
validates the model once.

Where a value comes from, first found wins::

    the flag  >  the environment variable  >  the settings file (--config)  >  the field's default

The settings file is YAML (or JSON), keyed by flag names without their dashes
(``manager-url: https://…``); a relative path in it is relative to the file. An empty environment
variable counts as unset. A variable renamed in a release is still read, under its old name, with
a warning (``Setting.old_env``) for one release. The variable is the option's default, so the
parser treats it as it treats the flag: a path made absolute, a choice checked.

A value that does not fit is one line naming where it came from::

    fabric-dra: error: --visible-timeout (from FABRIC_DRA_VISIBLE_TIMEOUT): Input should be greater than 0
"""

from __future__ import annotations

import argparse
import enum
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from plumbing.errors import PlumbingError
from plumbing.logs import get_logger

__all__ = ["ENV_PREFIX", "Setting", "SettingsError", "add_settings_arguments", "read_settings"]

log = get_logger(__name__)

#: the project's prefix of every environment variable a setting is read from
ENV_PREFIX = "FABRIC_DRA_"
_CONFIG_DEST = "settings_file"
_Model = TypeVar("_Model", bound=BaseModel)


class SettingsError(PlumbingError, ValueError):
    """A setting that does not fit, or a settings file that cannot be read: one line."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How a person gives a settings field (``Annotated`` metadata of the field)."""

    help: str
    #: the ``--help`` section it is listed under
    group: str = "options"
    #: the option, when not ``--<field-name>``
    flag: str | None = None
    #: the environment variable, when not ``FABRIC_DRA_<FIELD_NAME>`` (a Kubernetes convention such
    #: as ``NODE_NAME`` from the downward API); "" for none
    env: str | None = None
    #: names the variable had before, still read (with a warning) for one release
    old_env: tuple[str, ...] = ()
    metavar: str | None = None
    #: the values a flag accepts, when not the field's enum or Literal values
    choices: tuple[str, ...] | None = None
    #: an argparse ``type`` that checks a flag's value as the parser reads it (a usage error)
    check: Callable[[str], Any] | None = None
    #: the default as ``--help`` says it, when the field's own default is worked out from others
    shown_default: str | None = None


@dataclass(frozen=True, slots=True)
class _Declared:
    name: str
    field: FieldInfo
    setting: Setting
    flag: str
    env: str | None

    @property
    def key(self) -> str:
        """Its key in a settings file."""
        return self.flag.removeprefix("--")


def _declared(model: type[BaseModel], env_prefix: str) -> Iterator[_Declared]:
    for name, field in model.model_fields.items():
        setting = next((m for m in field.metadata if isinstance(m, Setting)), None)
        if setting is None:
            continue
        flag = setting.flag or f"--{name.replace('_', '-')}"
        env = setting.env if setting.env is not None else f"{env_prefix}{name.upper()}"
        yield _Declared(name, field, setting, flag, env or None)


def _is_bool(field: FieldInfo) -> bool:
    return field.annotation is bool


def _is_path(field: FieldInfo) -> bool:
    annotation = field.annotation
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    return Path in args


def _choices(declared: _Declared) -> list[str] | None:
    if declared.setting.choices is not None:
        return list(declared.setting.choices)
    annotation = declared.field.annotation
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    for arg in args:
        if isinstance(arg, type) and issubclass(arg, enum.Enum):
            return [str(member.value) for member in arg]
        if typing.get_origin(arg) is typing.Literal:
            return [str(value) for value in typing.get_args(arg)]
    return None


def _default_text(field: FieldInfo) -> str | None:
    if field.default is PydanticUndefined or field.default is None or field.default_factory is not None:
        return None
    default = field.default
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, enum.Enum):
        return str(default.value)
    return str(default)


def _help(declared: _Declared) -> str:
    where = [f"env {declared.env}"] if declared.env else []
    default = declared.setting.shown_default or _default_text(declared.field)
    if default is not None:
        where.append(f"default {default}")
    text = declared.setting.help
    return f"{text} ({'; '.join(where)})" if where else text


#: where the parsed namespace keeps the origin of each value not given as a flag
_ORIGINS = "settings_origins"


class _Given(argparse.Action):
    """Marks a setting as given on the command line (it wins over everything else)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        origins = dict(getattr(namespace, _ORIGINS, {}))
        origins.pop(self.dest, None)
        setattr(namespace, _ORIGINS, origins)


class _GivenSwitch(argparse.BooleanOptionalAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        origins = dict(getattr(namespace, _ORIGINS, {}))
        origins.pop(self.dest, None)
        setattr(namespace, _ORIGINS, origins)


def add_settings_arguments(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    env_prefix: str = ENV_PREFIX,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Add an option for every setting of ``model``, and ``--config FILE``, to ``parser``.

    A setting's environment variable is its option's default, so the parser makes of it what it
    makes of the flag (a path made absolute, a usage error for a value its check refuses)."""
    env = os.environ if environ is None else environ
    groups: dict[str, argparse._ArgumentGroup] = {}
    origins: dict[str, str] = {}
    for declared in _declared(model, env_prefix):
        group = groups.get(declared.setting.group)
        if group is None:
            group = groups[declared.setting.group] = parser.add_argument_group(declared.setting.group)
        found = _from_environment(declared, env)
        kwargs: dict[str, Any] = {
            "dest": declared.name,
            "default": argparse.SUPPRESS if found is None else found[0],
            "help": _help(declared),
        }
        if found is not None:
            origins[declared.name] = found[1]
        if _is_bool(declared.field):
            kwargs["action"] = _GivenSwitch
        else:
            kwargs["action"] = _Given
            kwargs["type"] = declared.setting.check or (Path if _is_path(declared.field) else str)
            kwargs["choices"] = _choices(declared)
            kwargs["metavar"] = declared.setting.metavar
        group.add_argument(declared.flag, **kwargs)
    parser.add_argument(
        "--config",
        dest=_CONFIG_DEST,
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML or JSON file of settings keyed by flag name without dashes "
        "(manager-url: …); a flag wins over its environment variable, which wins over the file",
    )
    parser.set_defaults(**{_ORIGINS: origins})


def _read_file(path: Path, known: Mapping[str, _Declared]) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except OSError as err:
        raise SettingsError(f"cannot read settings file {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise SettingsError(f"settings file {path} is not YAML or JSON") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"settings file {path} must be a mapping of setting names to values")
    unknown = sorted(str(key) for key in loaded if key not in known)
    if unknown:
        raise SettingsError(f"settings file {path}: unknown setting {unknown[0]!r}")
    return {known[key].name: value for key, value in loaded.items()}


def _from_environment(declared: _Declared, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(value, variable) of the setting's variable, or of a name it had before."""
    if declared.env and environ.get(declared.env):
        return environ[declared.env], declared.env
    for old in declared.setting.old_env:
        if environ.get(old):
            return environ[old], old
    return None


def read_settings(model: type[_Model], args: argparse.Namespace, *, env_prefix: str = ENV_PREFIX) -> _Model:
    """The settings of ``model`` from ``args`` — parsed by a parser that
    :func:`add_settings_arguments` built, so flags and the environment are in it — and the
    settings file, validated once; raises :class:`SettingsError`."""
    declared = {d.name: d for d in _declared(model, env_prefix)}
    origins: dict[str, str] = getattr(args, _ORIGINS, {})
    path: Path | None = getattr(args, _CONFIG_DEST, None)
    from_file = _read_file(path, {d.key: d for d in declared.values()}) if path else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for name, item in declared.items():
        if name in vars(args):
            values[name] = getattr(args, name)
            variable = origins.get(name)
            sources[name] = item.flag if variable is None else f"{item.flag} (from {variable})"
            if variable is not None and variable in item.setting.old_env:
                log.warning(
                    "environment variable is deprecated; use the new name",
                    variable=variable,
                    new=item.env or item.flag,
                )
        elif path is not None and name in from_file:
            values[name] = _file_value(from_file[name], item, path)
            sources[name] = f"{item.flag} (from {path})"
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_one_line(err, declared, values, sources)) from None


def _file_value(value: Any, item: _Declared, path: Path) -> Any:
    """A path in a settings file is relative to the file's folder, as a kubeconfig's are."""
    if _is_path(item.field) and isinstance(value, str):
        return (path.parent / Path(value).expanduser()).absolute()
    return value


def _one_line(
    err: ValidationError,
    declared: Mapping[str, _Declared],
    values: Mapping[str, Any],
    sources: Mapping[str, str],
) -> str:
    first = err.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    name = str(first["loc"][0]) if first["loc"] else ""
    item = declared.get(name)
    if item is None:  # a rule over several settings: its message names them
        return message
    if first["type"] == "missing":
        also = f" (or set {item.env})" if item.env else ""
        return f"{item.flag} is required{also}: {item.setting.help}"
    return f"{sources.get(name, item.flag)} {values.get(name)!r}: {message}"
