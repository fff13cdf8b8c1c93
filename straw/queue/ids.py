"""Queue ids: which are accepted, and the directory name each one gets.

straw-queue 0.1.6 accepts any non-empty text as the id of a namespaced queue (it stores the
queue under a hash of the id), and its callers use that: vime names queues ``run:<hex>``,
``fork:<sha256>`` and ``debug:<uuid>``.  straw keeps a queue's directory readable, so the
rule here is the pair of functions below:

* ``check_queue_id``: 1 to ``MAX_QUEUE_ID_CHARS`` characters; no control character
  (C0, DEL, C1: NUL, newline and tab included), no ``/``, no lone surrogate, and not
  ``.`` or ``..``.  Those could leave the queue's directory, hide a name in a listing or
  split a log line; everything else straw-queue accepts is accepted.
* ``queue_dir_name``: the one path component a queue id is stored under.  An id of
  ``NAME_RE`` (letters, digits, ``.``, ``_``, ``-``, starting with a letter or digit; every
  id straw accepted before) is its own name, so existing pools open unchanged.  Any other
  id is percent-encoded (its UTF-8 bytes outside ``[A-Za-z0-9._~-]`` as ``%XX``):
  ``run:ab`` is stored as ``run%3Aab``.  An encoding longer than ``_MAX_ENCODED`` (a file
  name is at most 255 bytes) is replaced by ``%%`` and the SHA-256 of the id.

The mapping is injective, so two ids never share a directory: a ``NAME_RE`` id has no
``%`` and starts with a letter or digit, while an encoded id either has a ``%`` or, made
of safe characters only, is itself not ``NAME_RE``; percent-encoding is injective; and
``%%`` never occurs in an encoding (every ``%`` is followed by two hex digits), so a hashed
name is never an encoded one.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from ..checks import short_repr
from ..pool.refs import NAME_RE

MAX_QUEUE_ID_CHARS = 512  # the queue's owner and checkpoint owners stay under 1024
_MAX_ENCODED = 128  # longer encodings are hashed: a name stays well under 255 bytes
_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f/\ud800-\udfff]")
_SAFE = "._-"  # quote() also leaves letters, digits and "~" as they are


def check_queue_id(value: object) -> str:
    """``value`` if it is an accepted queue id; ``TypeError``/``ValueError`` naming it and
    the rule otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"queue_id must be a str, got {type(value).__name__}")
    problem = None
    if not value:
        problem = "is empty"
    elif len(value) > MAX_QUEUE_ID_CHARS:
        problem = f"has {len(value)} characters (at most {MAX_QUEUE_ID_CHARS})"
    elif value in (".", ".."):
        problem = "names a directory, not a queue"
    elif m := _REFUSED.search(value):
        problem = f"contains {m.group()!r} at position {m.start()}"
    if problem is not None:
        raise ValueError(
            f"queue_id {short_repr(value)} {problem}: a queue id is 1-{MAX_QUEUE_ID_CHARS} "
            "characters without '/', control characters (NUL, newline, tab, ...) or lone "
            "surrogates, and not '.' or '..'; choose another id"
        )
    return value


def queue_dir_name(queue_id: str) -> str:
    """The path component of the queue ``queue_id`` (an id ``check_queue_id`` accepts)."""
    if NAME_RE.match(queue_id):
        return queue_id
    encoded = quote(queue_id, safe=_SAFE, encoding="utf-8", errors="strict")
    if len(encoded) <= _MAX_ENCODED:
        return encoded
    return "%%" + hashlib.sha256(queue_id.encode("utf-8")).hexdigest()


__all__ = ["MAX_QUEUE_ID_CHARS", "check_queue_id", "queue_dir_name"]
