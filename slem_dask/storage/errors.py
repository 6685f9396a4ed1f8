"""The errors by which storage keeps a guarantee (each message says what is kept and
what to do)."""

from __future__ import annotations

__all__ = ["IntegrityError"]


class IntegrityError(RuntimeError):
    """A job stopped to keep a guarantee (its message says what is kept and what to do)."""
