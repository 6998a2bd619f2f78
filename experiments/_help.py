"""The experiments' help texts show every option's default (light: no JAX, so that a script
that must set JAX up before importing it, ``sharded_multihost``, can use it too)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help where it has a default (not ``None`` or
    ``False``) and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or isinstance(action, argparse._StoreConstAction)  # flags: --quick, --overwrite
        ):
            return text
        if isinstance(default, list | tuple):
            default = " ".join(map(str, default))
        default = str(default).replace("%", "%%")
        return f"{text} (default: {default})".lstrip()
