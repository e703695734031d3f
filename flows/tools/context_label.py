"""A request's context as the replay's report shows it (named contexts readably)."""

from __future__ import annotations

from typing import Any


def context_label(context: int | dict[str, Any]) -> int | str:
    """A request's context as a report shows it: an index as it is, named contexts as
    their values by attribute name (in name order), hashable either way.

    >>> context_label(3), context_label({"plan": "pro", "device": "ios"})
    (3, 'device=ios, plan=pro')
    """
    if isinstance(context, dict):
        return ", ".join(f"{name}={context[name]}" for name in sorted(context))
    return context
