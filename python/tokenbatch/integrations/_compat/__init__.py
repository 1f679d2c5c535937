"""The private hooks of other libraries that tokenbatch cannot avoid, one module per
library, each gated by the releases it was checked against.

Everything else in the integrations uses only what a library documents for extension.
Each module lists its hooks in ``HOOKS``; the test suite checks that every hook exists in
the installed release (``tests/test_compat.py``), and a hook that a release moved fails
with an error naming it rather than with an ``AttributeError`` deep inside a training
loop.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokenbatch.errors import TokenBatchError

if TYPE_CHECKING:
    from packaging.version import Version


class UnsupportedVersionError(TokenBatchError, RuntimeError):
    """The installed release of a library no longer has a private hook tokenbatch needs."""


@dataclasses.dataclass(frozen=True)
class Hook:
    """One private name of a library: ``owner`` (``"package.module:Class"``) and
    ``name``, found on the object ``probe`` returns (default: the owner itself, for names
    a class defines; a probe builds an instance for names set in ``__init__``)."""

    package: str
    owner: str
    name: str
    why: str
    probe: Callable[[], object] | None = None

    @property
    def qualified(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"

    def target(self) -> object:
        if self.probe is not None:
            return self.probe()
        module, _, attribute = self.owner.partition(":")
        found: object = importlib.import_module(module)
        for part in filter(None, attribute.split(".")):
            found = getattr(found, part)
        return found

    def exists(self) -> bool:
        return hasattr(self.target(), self.name)

    def get(self, obj: object) -> Any:
        """``getattr(obj, name)``, or an error naming the hook and the release."""
        try:
            return getattr(obj, self.name)
        except AttributeError:
            raise UnsupportedVersionError(
                f"{self.package} {installed(self.package)} has no {self.qualified}, which "
                f"tokenbatch uses to {self.why}; install a {self.package} release in the "
                "range tokenbatch supports (docs/compatibility.md)"
            ) from None


def installed(package: str) -> Version:
    """The installed release of ``package`` (``packaging`` comes with every library that
    has a compatibility module)."""
    from packaging.version import Version

    return Version(importlib.metadata.version(package))
