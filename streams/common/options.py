"""Files that several commands take: the engine config (`--config`) and the HMAC key (`--hmac-key-file`).

One reading of each, so every command rejects the same bad input the same way:
one line naming the file, exit 2.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from engine import config as config_mod
from engine.errors import InvalidConfig
from streams.common import logs
from streams.common.errors import UsageError


def load_config(path: str | None) -> config_mod.Config:
    """The engine config in a YAML file (README, config keys); defaults without one."""
    if not path:
        return config_mod.Config()
    try:
        return config_mod.parse(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, InvalidConfig) as exc:
        raise UsageError(f"{path}: {exc}") from exc


def load_key(path: str | None) -> bytes | None:
    """The HMAC key, or None without a file. An empty key is refused: it would sign
    every record with a key anyone can reproduce."""
    if not path:
        return None
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --hmac-key-file {path}: {exc.strerror or exc}") from exc
    if not key:
        raise UsageError(f"--hmac-key-file {path} is empty")
    logs.secret(key)  # whatever logs it by mistake (a record's repr, a library's debug line) masks it
    return key
