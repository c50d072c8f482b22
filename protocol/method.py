"""The base class of the generated method classes in ``protocol.spec``."""

from __future__ import annotations

from typing import Any, ClassVar


class Method:
    """One AMQP method's arguments; subclasses are generated, one per method.

    A subclass's ``__slots__`` lists its arguments in wire order (reserved
    arguments excluded); ``FIELDS`` pairs each with its AMQP type.
    """

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # mutable, so unhashable

    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    INDEX: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    SYNCHRONOUS: ClassVar[bool] = False
    HAS_CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[type[Method], ...]] = ()
    TO_SERVER: ClassVar[bool] = False
    TO_CLIENT: ClassVar[bool] = False
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def encode(self) -> bytes:
        """The argument payload (without class and method ids)."""
        raise NotImplementedError

    @classmethod
    def decode(
        cls, buf: bytes | bytearray | memoryview, offset: int = 0, end: int | None = None
    ) -> Method:
        """Decode the arguments in ``buf[offset:end]``, which they must fill exactly.

        ``end`` defaults to the end of ``buf``; the frame parser passes the
        frame's bounds rather than slicing the payload out.
        """
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({args})"

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}
