"""One declaration per setting, read from flags, the environment and a settings file alike.

A role's settings are one pydantic model. Each field is a setting: its name, type, default and
checks are the field's, and a :class:`Setting` in its ``Annotated`` metadata says how a person
gives it — the help text (the field's description when it gives none), the ``--help`` group, and
where that differs from the rule, the flag (``--<field-name>``) and the environment variable
(``FABRIC_DRA_<FLAG_NAME>``). A field that holds nested settings (a pydantic model or a dataclass
declared elsewhere, such as a client's settings) carries a :class:`Section` instead: each of the
nested fields it names is a setting too, its flag prefixed (``redfish`` → ``--redfish-ca-file``).
Everything else is derived from that declaration: :func:`add_settings_arguments` adds the options
to an argparse parser (``--help`` names each variable and default), :func:`read_settings` gathers
the values and validates the model once, :func:`settings_options` lists them.

One name per setting: the flag ``--warm-size``, the variable ``FABRIC_DRA_WARM_SIZE`` (the role's
prefix and the flag's name), the key ``warm-size`` of the settings file. Where a value comes from,
first found wins::

    the flag  >  the environment variable  >  the settings file (--config)  >  the field's default

The settings file is YAML (or JSON), keyed by flag names without their dashes
(``manager-url: https://…``); a relative path in it is relative to the file. An empty environment
variable counts as unset. A variable renamed in a release is still read, under its old name, with
a warning (``Setting.old_env``) for one release. The variable is the option's default, so the
parser treats it as it treats the flag: a path made absolute, a choice checked.

A bool is a switch (``--events`` / ``--no-events``; ``true``/``false`` in the variable and the
file). A list is a repeatable flag (``--warm-node a --warm-node b``; ``a,b`` in the variable, a
list in the file); a dict is a repeatable ``KEY=VALUE`` flag (``K=V,K2=V2`` in the variable, a
mapping in the file). A list given on the command line replaces the variable's or the file's, it
does not add to it.

A value that does not fit is one line naming where it came from::

    fabric-dra: error: --visible-timeout (from FABRIC_DRA_VISIBLE_TIMEOUT): Input should be greater than 0
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from plumbing.errors import PlumbingError
from plumbing.logs import get_logger

__all__ = [
    "ENV_PREFIX",
    "OptionKind",
    "Section",
    "Setting",
    "SettingOption",
    "SettingsError",
    "add_settings_arguments",
    "path_pair",
    "read_settings",
    "settings_options",
]

log = get_logger(__name__)

#: the project's prefix of every environment variable a setting is read from
ENV_PREFIX = "FABRIC_DRA_"
_CONFIG_DEST = "settings_file"
_Model = TypeVar("_Model", bound=BaseModel)


class SettingsError(PlumbingError, ValueError):
    """A setting that does not fit, or a settings file that cannot be read: one line."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How a person gives a settings field (``Annotated`` metadata of the field, or an entry of a
    :class:`Section`)."""

    #: the help text; "" for the field's description
    help: str = ""
    #: the ``--help`` section it is listed under
    group: str = "options"
    #: the option, when not ``--<field-name>`` (``--<prefix>-<field-name>`` in a section)
    flag: str | None = None
    #: the environment variable, when not ``FABRIC_DRA_<FLAG_NAME>`` (a Kubernetes convention such
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
class Section:
    """Nested settings (``Annotated`` metadata of a field whose type is a pydantic model or a
    dataclass declared elsewhere): nested field name → its :class:`Setting`, in the order shown.

    The nested fields' defaults are their class's, so the field is required or defaults to the
    class's own defaults (``default_factory=Model``). Its fields not named here are not settings:
    they keep their defaults."""

    settings: Mapping[str, Setting]
    #: the flag prefix of the nested fields without a ``flag`` (``redfish`` → ``--redfish-ca-file``)
    prefix: str = ""


class OptionKind(enum.StrEnum):
    VALUE = "value"  # --flag VALUE
    SWITCH = "switch"  # a bool off by default: --flag turns it on
    NEGATED = "negated"  # a bool on by default: --no-flag turns it off
    REPEATED = "repeated"  # --flag VALUE, again and again: a list
    PAIRS = "pairs"  # --flag KEY=VALUE, again and again: a dict


@dataclass(frozen=True, slots=True)
class SettingOption:
    """One setting as a person gives it, derived from its declaration."""

    #: the field within the model (a section's name first)
    path: tuple[str, ...]
    flag: str
    #: the environment variable, or None
    env: str | None
    kind: OptionKind
    help: str
    setting: Setting
    annotation: Any
    #: the field's default (a default factory's value); PydanticUndefined when it is required
    default: Any

    @property
    def option(self) -> str:
        """The option that changes the default (``--no-events`` for a switch on by default)."""
        if self.kind is OptionKind.NEGATED:
            return "--no-" + self.flag.removeprefix("--")
        return self.flag

    @property
    def key(self) -> str:
        """Its key in a settings file."""
        return self.flag.removeprefix("--")

    @property
    def dest(self) -> str:
        """Its name in the parsed namespace: the field's, or for a nested field the flag's."""
        return self.path[0] if len(self.path) == 1 else self.key.replace("-", "_")

    @property
    def group(self) -> str:
        return self.setting.group

    @property
    def required(self) -> bool:
        return self.default is PydanticUndefined


def settings_options(model: type[BaseModel], *, env_prefix: str = ENV_PREFIX) -> list[SettingOption]:
    """Every setting of ``model``, in the order ``--help`` lists them (by group, first seen first)."""
    found: list[SettingOption] = []
    for name, field in model.model_fields.items():
        for marker in field.metadata:
            if isinstance(marker, Setting):
                default = _default_of(field)
                description = field.description or ""
                found.append(_option((name,), marker, field.annotation, default, description, "", env_prefix))
            elif isinstance(marker, Section):
                nested = _fields_of(field.annotation)
                for nested_name, setting in marker.settings.items():
                    annotation, default, description = nested[nested_name]
                    found.append(
                        _option(
                            (name, nested_name),
                            setting,
                            annotation,
                            default,
                            description,
                            marker.prefix,
                            env_prefix,
                        )
                    )
    _check_unique(model, found)
    groups = list(dict.fromkeys(o.group for o in found))
    return sorted(found, key=lambda o: groups.index(o.group))


def _check_unique(model: type[BaseModel], options: list[SettingOption]) -> None:
    for attribute in ("flag", "dest"):
        names = [getattr(o, attribute) for o in options]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"{model.__name__} declares the {attribute} {twice[0]} twice")


def _default_of(field: FieldInfo) -> Any:
    """The field's default (a factory's value), or PydanticUndefined when it is required."""
    return PydanticUndefined if field.is_required() else field.get_default(call_default_factory=True)


def _fields_of(model: Any) -> dict[str, tuple[Any, Any, str]]:
    """field → (annotation, default, description) of a pydantic model or a dataclass."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {
            name: (info.annotation, _default_of(info), info.description or "")
            for name, info in model.model_fields.items()
        }
    if not (isinstance(model, type) and dataclasses.is_dataclass(model)):
        raise TypeError(f"a Section's field must be a pydantic model or a dataclass, not {model!r}")
    hints = typing.get_type_hints(model)
    fields: dict[str, tuple[Any, Any, str]] = {}
    for item in dataclasses.fields(model):
        if item.default is not dataclasses.MISSING:
            default: Any = item.default
        elif item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        else:
            default = PydanticUndefined
        fields[item.name] = (hints[item.name], default, "")
    return fields


def _option(
    path: tuple[str, ...],
    setting: Setting,
    annotation: Any,
    default: Any,
    description: str,
    prefix: str,
    env_prefix: str,
) -> SettingOption:
    name = path[-1].replace("_", "-")
    flag = setting.flag or "--" + "-".join(p for p in (prefix, name) if p)
    env = (
        setting.env
        if setting.env is not None
        else env_prefix + flag.removeprefix("--").upper().replace("-", "_")
    )
    value_type = _without_none(annotation)
    origin = typing.get_origin(value_type)
    if value_type is bool:
        kind = OptionKind.NEGATED if default is True else OptionKind.SWITCH
    elif origin is list:
        kind = OptionKind.REPEATED
    elif origin is dict:
        kind = OptionKind.PAIRS
    else:
        kind = OptionKind.VALUE
    help_text = setting.help or description
    return SettingOption(path, flag, env or None, kind, help_text, setting, annotation, default)


def _without_none(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007 - built at run time
    return annotation


def _is_path(annotation: Any) -> bool:
    value_type = _without_none(annotation)
    if typing.get_origin(value_type) is list:
        value_type = typing.get_args(value_type)[0]
    return value_type is Path


def _is_path_pairs(annotation: Any) -> bool:
    """A dict of paths (``--manager-ca-files NAME=FILE``)."""
    value_type = _without_none(annotation)
    return typing.get_origin(value_type) is dict and typing.get_args(value_type)[1:] == (Path,)


def path_pair(text: str) -> str:
    """The argparse ``type`` of a dict of paths: ``KEY=PATH`` with PATH made absolute, as a path
    flag's value is (anything else is left for the pair's own check)."""
    key, sep, value = text.partition("=")
    return f"{key}={Path(value).expanduser().absolute()}" if sep and key and value else text


def _is_secret(annotation: Any) -> bool:
    return _without_none(annotation) is SecretStr


def _choices_of(annotation: Any) -> tuple[str, ...] | None:
    """The strings a Literal, an enum, or a union of them allows, in declaration order."""
    if typing.get_origin(annotation) is Literal:
        return tuple(str(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(str(m.value) for m in annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        parts = [_choices_of(a) for a in typing.get_args(annotation) if a is not type(None)]
        if parts and all(parts):
            return tuple(c for part in parts for c in part or ())
    return None


def _choices(option: SettingOption) -> tuple[str, ...] | None:
    """The values a flag (for PAIRS: the VALUE part) accepts."""
    if option.setting.choices is not None:
        return option.setting.choices
    value_type = _without_none(option.annotation)
    if option.kind is OptionKind.PAIRS:
        return _choices_of(typing.get_args(value_type)[1])
    if option.kind is OptionKind.REPEATED:
        return _choices_of(typing.get_args(value_type)[0])
    return _choices_of(value_type)


def _default_text(option: SettingOption) -> str | None:
    default = option.default
    if option.setting.shown_default is not None:
        return option.setting.shown_default
    if default is PydanticUndefined or default is None or default in ([], {}):
        return None
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, enum.Enum):
        return str(default.value)
    if isinstance(default, list):
        return ",".join(str(d) for d in default)
    if isinstance(default, dict):
        return ",".join(f"{k}={v}" for k, v in default.items())
    return str(default)


def _help(option: SettingOption) -> str:
    where = [f"env {option.env}"] if option.env else []
    default = _default_text(option)
    if default is not None:
        where.append(f"default {default}")
    if option.kind in (OptionKind.REPEATED, OptionKind.PAIRS):
        where.append("repeatable")
    text = option.help.replace("%", "%%")  # argparse formats help with %
    return f"{text} ({'; '.join(where)})" if where else text


#: where the parsed namespace keeps the origin of each value not given as a flag: the variable it
#: came from, or "" for the field's default (which the namespace holds, so that it has every setting)
_ORIGINS = "settings_origins"
_DEFAULTED = ""


def _given(namespace: Any, dest: str) -> dict[str, str]:
    """Marks ``dest`` as given on the command line; the origins it had before."""
    before: dict[str, str] = dict(getattr(namespace, _ORIGINS, {}))
    origins = dict(before)
    origins.pop(dest, None)
    setattr(namespace, _ORIGINS, origins)
    return before


class _Given(argparse.Action):
    """A setting given on the command line (it wins over everything else)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _given(namespace, self.dest)


class _GivenItem(argparse.Action):
    """One item of a repeatable flag: the first replaces what the environment or default said."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        before = _given(namespace, self.dest)
        current = [] if self.dest in before else list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, [*current, values])


class _GivenSwitch(argparse.BooleanOptionalAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _given(namespace, self.dest)


def add_settings_arguments(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    env_prefix: str = ENV_PREFIX,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Add an option for every setting of ``model``, and ``--config FILE``, to ``parser``.

    A setting's environment variable is its option's default, so the parser makes of it what it
    makes of the flag (a path made absolute, a usage error for a value its check refuses); without
    one the default is the field's, so the namespace holds every setting but a required one."""
    env = os.environ if environ is None else environ
    groups: dict[str, argparse._ArgumentGroup] = {}
    origins: dict[str, str] = {}
    options = settings_options(model, env_prefix=env_prefix)
    for option in options:
        group = groups.get(option.group)
        if group is None:
            group = groups[option.group] = parser.add_argument_group(option.group)
        found = _from_environment(option, env)
        if found is not None:
            default = _split(found[0]) if option.kind in (OptionKind.REPEATED, OptionKind.PAIRS) else found[0]
            origins[option.dest] = found[1]
        elif option.required:
            default = argparse.SUPPRESS
        else:
            default = option.default
            origins[option.dest] = _DEFAULTED
        kwargs: dict[str, Any] = {"dest": option.dest, "default": default, "help": _help(option)}
        if option.kind in (OptionKind.SWITCH, OptionKind.NEGATED):
            kwargs["action"] = _GivenSwitch
        else:
            kwargs["action"] = (
                _GivenItem if option.kind in (OptionKind.REPEATED, OptionKind.PAIRS) else _Given
            )
            kwargs["type"] = option.setting.check or (
                Path
                if _is_path(option.annotation)
                else path_pair
                if _is_path_pairs(option.annotation)
                else str
            )
            if option.kind is not OptionKind.PAIRS:  # a pair's value is checked when it is split
                kwargs["choices"] = _choices(option)
            kwargs["metavar"] = option.setting.metavar or (
                "KEY=VALUE" if option.kind is OptionKind.PAIRS else None
            )
        group.add_argument(option.flag, **kwargs)
    parser.add_argument(
        "--config",
        dest=_CONFIG_DEST,
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML or JSON file of settings keyed by flag name without dashes "
        f"({options[0].key if options else 'name'}: …); a flag wins over its environment variable, "
        "which wins over the file",
    )
    parser.set_defaults(**{_ORIGINS: origins})


def _split(text: str) -> list[str]:
    """A list in an environment variable: comma-separated."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _read_file(path: Path, known: Mapping[str, SettingOption]) -> dict[str, Any]:
    """The settings file's values, by the options' ``dest``."""
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
    return {known[key].dest: value for key, value in loaded.items()}


def _from_environment(option: SettingOption, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(value, variable) of the setting's variable, or of a name it had before."""
    if option.env and environ.get(option.env):
        return environ[option.env], option.env
    for old in option.setting.old_env:
        if environ.get(old):
            return environ[old], old
    return None


def read_settings(model: type[_Model], args: argparse.Namespace, *, env_prefix: str = ENV_PREFIX) -> _Model:
    """The settings of ``model`` from ``args`` — parsed by a parser that
    :func:`add_settings_arguments` built, so flags and the environment are in it — and the
    settings file, validated once; raises :class:`SettingsError`."""
    options = settings_options(model, env_prefix=env_prefix)
    origins: dict[str, str] = getattr(args, _ORIGINS, {})
    path: Path | None = getattr(args, _CONFIG_DEST, None)
    from_file = _read_file(path, {o.key: o for o in options}) if path else {}
    values: dict[str, Any] = {}
    for option in options:
        if len(option.path) > 1:  # a section is there even when none of its settings is given
            values.setdefault(option.path[0], {})
    given: dict[tuple[str, ...], tuple[Any, str]] = {}  # path → (value as given, where from)
    for option in options:
        origin = origins.get(option.dest)
        if option.dest in vars(args) and origin != _DEFAULTED:
            raw = getattr(args, option.dest)
            source = option.flag if origin is None else f"{option.flag} (from {origin})"
            if origin is not None and origin in option.setting.old_env:
                log.warning(
                    "environment variable is deprecated; use the new name",
                    variable=origin,
                    new=option.env or option.flag,
                )
        elif path is not None and option.dest in from_file:
            raw = _file_value(from_file[option.dest], option, path)
            source = f"{option.flag} (from {path})"
        else:
            continue
        given[option.path] = (raw, source)
        target = values
        for section in option.path[:-1]:
            target = target[section]
        target[option.path[-1]] = _shaped(raw, option, source)
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_one_line(err, options, given)) from None


def _file_value(value: Any, option: SettingOption, path: Path) -> Any:
    """A path in a settings file is relative to the file's folder, as a kubeconfig's are; a list
    may be written as the variable writes it (``a,b``)."""
    if option.kind in (OptionKind.REPEATED, OptionKind.PAIRS) and isinstance(value, str):
        value = _split(value)
    if _is_path_pairs(option.annotation):
        if isinstance(value, dict):
            return {k: (path.parent / Path(str(v)).expanduser()).absolute() for k, v in value.items()}
        if isinstance(value, list):
            return [_file_pair(str(v), path) for v in value]
    if _is_path(option.annotation):
        if isinstance(value, str):
            return (path.parent / Path(value).expanduser()).absolute()
        if isinstance(value, list):
            return [
                (path.parent / Path(v).expanduser()).absolute() if isinstance(v, str) else v for v in value
            ]
    return value


def _file_pair(text: str, path: Path) -> str:
    """``KEY=PATH`` of a settings file, PATH relative to the file's folder."""
    key, sep, value = text.partition("=")
    return f"{key}={(path.parent / Path(value).expanduser()).absolute()}" if sep and key and value else text


def _shaped(value: Any, option: SettingOption, source: str) -> Any:
    """``KEY=VALUE`` items (flags, the variable, a list in the file) as the dict they say, each
    VALUE one the setting allows; anything else as it is, for the model to check."""
    if option.kind is not OptionKind.PAIRS or isinstance(value, dict):
        return value
    if not isinstance(value, list):
        return value
    metavar = option.setting.metavar or "KEY=VALUE"
    choices = _choices(option)
    found: dict[str, str] = {}
    for item in value:
        key, sep, part = str(item).partition("=")
        if not sep or not key or (choices and part not in choices):
            allowed = f" with {metavar.partition('=')[2]} one of {', '.join(choices)}" if choices else ""
            raise SettingsError(f"{source} {item!r}: expected {metavar}{allowed}")
        found[key] = part
    return found


def _one_line(
    err: ValidationError,
    options: list[SettingOption],
    given: Mapping[tuple[str, ...], tuple[Any, str]],
) -> str:
    first = err.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    loc = tuple(str(part) for part in first["loc"])
    option = next((o for o in options if o.path == loc[: len(o.path)]), None)
    if option is None:  # a rule over several settings: its message names them
        return message
    if first["type"] == "missing":
        also = f" (or set {option.env})" if option.env else ""
        return f"{option.flag} is required{also}: {option.help}"
    value, source = given.get(option.path, (option.default, option.flag))
    shown = "'**********'" if _is_secret(option.annotation) else repr(value)
    if len(option.path) > 1 and first["type"] == "value_error":  # its model's own words for its fields
        message = f"invalid setting {'.'.join(option.path[1:])}: {message}"
    return f"{source} {shown}: {message}"
