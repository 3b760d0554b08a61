"""The errors a user can fix: bad input (:class:`InputError`) and an environment that refuses (disk full, read-only,
permission). Jobs print either as one line and exit 2; a traceback is left for bugs."""

from __future__ import annotations

import errno
import re


class InputError(ValueError):
    """Bad input (a missing model, a malformed row, an unknown config key); the message names it."""


ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "not a directory",
    errno.EISDIR: "is a directory",
    errno.EEXIST: "already exists",
    errno.ENAMETOOLONG: "name too long",
    errno.EFBIG: "file too large",
}
# How libraries that raise no OSError report an errno: Rust's "(os error 28)" (safetensors, tokenizers), and
# Arrow's "[errno 28]" (pyarrow filesystems, which Ray Train uploads checkpoints with).
_OS_ERROR = re.compile(r"\(os error (\d+)\)|\[errno (\d+)\]", re.IGNORECASE)


def environment_errno(err: BaseException) -> int | None:
    """The errno of an error the environment caused (see :data:`ENVIRONMENT_ERRNOS`), else None."""
    code = err.errno if isinstance(err, OSError) else None
    if code is None and (match := _OS_ERROR.search(str(err))):
        code = int(match.group(1) or match.group(2))
    return code if code in ENVIRONMENT_ERRNOS else None
