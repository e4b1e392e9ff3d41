"""The operator console: the kernel seen from a browser (``dirk console``).

A small web application (Starlette, server-sent events, htmx vendored as static
files) over one journal file. It follows the journal read-only and changes
nothing by itself: every decision, status change and rule decision is one row in
the operator inbox (kernel.inbox), exactly as ``dirk decide`` writes it, which
the running kernel applies once and records with the operator's name and
reason. So the console works whether the kernel runs or not.

The web libraries come with the extra ``dir-kernel[console]``. Importing this
package imports none of them; only running the console does (kernel.console._app),
so ``import kernel`` and ``dirk`` work without the extra.
"""

from kernel.console._command import add_commands

__all__ = ["add_commands"]
