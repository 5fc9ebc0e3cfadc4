"""Files API wire shapes (``/v1/files``): the upload's multipart body, read incrementally, and
the file object.

An upload is ``multipart/form-data`` with a ``file`` part (its bytes and ``filename``), a
``purpose`` field and, optionally, ``expires_after[anchor]`` and ``expires_after[seconds]``
(how the SDKs send the ``expires_after`` object). ``FormReader`` parses the body a piece at a
time with python-multipart's streaming parser (the one Starlette uses): ``feed(data)`` gives
the events those bytes complete, ``finish()`` checks the body ended. The file's bytes pass
through as ``FileData`` events and are never gathered here; everything else it holds is
bounded: at most ``MAX_PARTS`` parts, each with python-multipart's bounds on its headers
(8 of them, 4 KiB each), and ``MAX_FIELD_BYTES`` of a field's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from podium.errors import InvalidRequestError

# What a client may upload for: Batch API input, and OpenAI's "flexible file type for any
# purpose". OpenAI's others (assistants, fine-tune, vision, evals) name APIs Podium does not
# have: refused, so a file nothing here would use is not kept.
PURPOSES = ("batch", "user_data")
MAX_PARTS = 8                    # parts of an upload's body
MAX_FIELD_BYTES = 1024           # a field's value (purpose, expires_after[...])
MAX_FILENAME = 255               # characters of a file's name (a file system's limit)
FIELDS = ("purpose", "expires_after[anchor]", "expires_after[seconds]")
EXPIRES_MIN, EXPIRES_MAX = 3600, 30 * 86400      # expires_after.seconds, as OpenAI bounds it
Obj = dict[str, Any]


@dataclass
class Field:
    name: str
    value: str


@dataclass
class FileBegin:
    filename: str


@dataclass
class FileData:
    data: bytes


class FileEnd:
    pass


Event = Field | FileBegin | FileData | FileEnd


def _bad(message: str, param: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def boundary_of(content_type: str | None) -> bytes:
    """The multipart boundary of the request's ``Content-Type``; a 400 if it is not
    ``multipart/form-data`` with one."""
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data" or not options.get(b"boundary"):
        raise _bad("Uploads are multipart/form-data (a 'file' part and a 'purpose' field), "
                   f"not {content_type or 'no Content-Type'!r}")
    return options[b"boundary"]


class FormReader:
    """An upload's body, a piece at a time: ``feed(data)`` -> events, ``finish()``. Cost:
    python-multipart's scan of each byte once; a field's value is held until its part ends
    (at most ``MAX_FIELD_BYTES``), the file's bytes not at all."""

    def __init__(self, boundary: bytes):
        try:
            self._parser = MultipartParser(boundary, {
                "on_part_begin": self._begin, "on_header_field": self._on_field,
                "on_header_value": self._on_value, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_done, "on_part_data": self._data,
                "on_part_end": self._end, "on_end": self._done})
        except FormParserError as exc:
            raise _bad(f"The upload's multipart boundary is invalid: {exc}") from None
        self._events: list[Event] = []
        self._parts = 0
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._name = ""
        self._file = False
        self._value = bytearray()
        self._ended = False

    def feed(self, data: bytes) -> list[Event]:
        try:
            self._parser.write(data)
        except FormParserError as exc:
            raise _bad(f"The upload is not valid multipart/form-data: {exc}") from None
        events, self._events = self._events, []
        return events

    def finish(self) -> list[Event]:
        """The last events; a 400 if the body ended before its closing boundary."""
        self._parser.finalize()
        if not self._ended:
            raise _bad("The upload's multipart body ended before its closing boundary")
        events, self._events = self._events, []
        return events

    # -- python-multipart's callbacks ----------------------------------------------------

    def _begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise _bad(f"An upload has at most {MAX_PARTS} parts")
        self._disposition, self._file = b"", False
        self._value.clear()

    def _on_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _on_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _headers_done(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._name = _text(options.get(b"name", b""), "a part's name")
        if not self._name:
            raise _bad("Each part of an upload needs a Content-Disposition with a name")
        if self._name == "file":
            if b"filename" not in options:
                raise _bad("'file' must be a file (a part with a filename), not a field",
                           "file")
            self._file = True
            self._events.append(FileBegin(_text(options[b"filename"], "the file's name")))
        elif self._name not in FIELDS:
            raise _bad(f"Unrecognized request argument supplied: {self._name}", self._name)

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._file:
            self._events.append(FileData(data[start:end]))
            return
        self._value += data[start:end]
        if len(self._value) > MAX_FIELD_BYTES:
            raise _bad(f"'{self._name}' is longer than {MAX_FIELD_BYTES} bytes", self._name)

    def _end(self) -> None:
        if self._file:
            self._events.append(FileEnd())
        else:
            self._events.append(Field(self._name, _text(bytes(self._value), self._name)))

    def _done(self) -> None:
        self._ended = True


def _text(raw: bytes, what: str) -> str:
    """A header parameter (python-multipart gives latin-1 bytes of what came: UTF-8, as
    browsers and httpx send it) or a field's value, as text."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{what} is not valid UTF-8") from None


def check_filename(name: str) -> str:
    if not name.strip():
        raise _bad("The file needs a name: its part's Content-Disposition has an empty "
                   "filename", "file")
    if len(name) > MAX_FILENAME:
        raise _bad(f"The file's name is longer than {MAX_FILENAME} characters", "file")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _bad("The file's name holds control characters", "file")
    return name


def check_purpose(value: str | None) -> str:
    if value is None:
        raise _bad("Missing required parameter: 'purpose'.", "purpose")
    if value not in PURPOSES:
        raise _bad(f"Invalid value for purpose: {value[:64]!r}. Supported values are: "
                   + ", ".join(f"'{p}'" for p in PURPOSES) + ".", "purpose")
    return value


def expires_after(anchor: str | None, seconds: str | None) -> int | None:
    """``expires_after.seconds`` (its anchor can only be ``created_at``); None if absent."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _bad(f"Invalid value for expires_after.anchor: {anchor!r}. Supported values "
                   "are: 'created_at'.", "expires_after.anchor")
    try:
        value = int(seconds or "")
    except ValueError:
        value = -1
    if not EXPIRES_MIN <= value <= EXPIRES_MAX:
        raise _bad(f"Invalid value for expires_after.seconds: {seconds!r}. Expected an "
                   f"integer between {EXPIRES_MIN} and {EXPIRES_MAX}.", "expires_after.seconds")
    return value


def file_object(file_id: str, purpose: str, filename: str, size: int, created_at: int,
                expires_at: int | None) -> Obj:
    """OpenAI's file object (``status`` and ``status_details``: deprecated, always
    ``processed`` and null)."""
    return {"id": file_id, "object": "file", "bytes": size, "created_at": created_at,
            "filename": filename, "purpose": purpose, "status": "processed",
            "expires_at": expires_at, "status_details": None}
