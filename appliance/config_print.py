"""The configuration printed: ``appliance check-config``'s TOML (secrets hidden), the start's
list of non-default keys, the plain dict that reloads compare. Split from ``appliance.config``
(the sections, their checks and the loading) by concern; runs in any process that prints or
compares a loaded ``Config``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from appliance.config import Config

__all__ = ["non_defaults", "to_toml_dict", "dumps_toml", "SECRET_KEYS", "HIDDEN"]


def non_defaults(cfg: Config) -> list[str]:
    """``key=value`` of every key whose value is not its default, in file order (logged at start
    so that an operator sees what a host's file and environment changed)."""
    out: list[str] = []

    def walk(prefix: str, have: dict[str, Any], default: dict[str, Any]) -> None:
        for k, v in have.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                walk(key, v, default.get(k, {}))
            elif v != default.get(k):
                out.append(f"{key}={v!r}")
    walk("", to_toml_dict(cfg), to_toml_dict(Config()))
    return out


def to_toml_dict(cfg: Config) -> dict[str, Any]:
    return msgspec.to_builtins(cfg)


def dumps_toml(cfg: Config) -> str:
    """Render the effective configuration as TOML (for ``appliance check-config``)."""
    lines: list[str] = []

    def emit(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        subs = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_toml_scalar(v)}")
        if prefix:
            lines.append("")
        for k, v in subs.items():
            emit(f"{prefix}.{k}" if prefix else k, v)

    shown = to_toml_dict(cfg)
    for section, key in SECRET_KEYS:
        if shown[section][key]:
            shown[section][key] = HIDDEN       # check-config output lands in logs and tickets
    emit("", shown)
    return "\n".join(lines).rstrip() + "\n"


# Keys whose values ``appliance check-config`` does not print.
SECRET_KEYS = (("tls", "key_password"), ("console", "ssl_password"))
HIDDEN = "[hidden]"


def _toml_scalar(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_scalar(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
