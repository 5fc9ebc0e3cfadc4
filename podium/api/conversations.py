"""The Conversations API: conversations and their items, kept for the Responses API.

A conversation is an ordered list of items (messages, tool calls and their outputs,
reasoning) that belongs to the API key that made it, as a stored response does: another
key's conversation is a 404, the same answer as for one that never was. Items are validated
by the function that validates the Responses API's ``input`` (``translate.check_item``:
shape, text-only content, status, a seal that opens for the caller's key, ids unique within
the conversation, no client-made ``mcp_approval_request``) and get ids when they come
without; they are stored in the shapes OpenAI lists them in (a message's text as content
parts, ``status`` on messages, calls and outputs). A conversation's stored items are checked
again before a response uses them, so an item stored before these checks (or altered in the
database) is a 400 naming the conversation and the item, not a failure deep in rendering.

``responses.create(conversation=...)`` reads the conversation's items before its input and,
when the response finishes, appends its input and output items (``append_turn``): see the
append policy in docs/architecture.md ("Conversations").
"""

from __future__ import annotations

import logging
import time
from typing import Any

from podium.api.responses.translate import check_item, duplicate_id, new_item_id, normalize_input
from podium.api.sealing import Sealer
from podium.errors import InvalidRequestError, NotFoundError
from podium.generation import off_loop
from podium.protocol.conversations import (ConversationCreateRequest,
                                           ConversationUpdateRequest, ItemsCreateRequest)
from podium.settings import Settings
from podium.store.base import NO_OWNER
from podium.store.conversations import ConversationStore, ItemIdTaken

log = logging.getLogger(__name__)
Obj = dict[str, Any]

MAX_ITEMS = 20                    # items in one create (of a conversation, or of items)
MAX_METADATA, MAX_KEY, MAX_VALUE = 16, 64, 512
INCLUDABLE = frozenset({
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs", "reasoning.encrypted_content",
    "message.output_text.logprobs"})
APPENDING = frozenset({"completed", "incomplete"})    # statuses whose turn is appended


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """OpenAI's limits: 16 pairs, keys of at most 64 characters, values of at most 512."""
    metadata = metadata or {}
    if len(metadata) > MAX_METADATA:
        raise InvalidRequestError(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA} properties, but got an object with {len(metadata)} properties "
            f"instead.", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_KEY:
            raise InvalidRequestError(
                f"Invalid 'metadata': key {key[:MAX_KEY]!r}... is too long. Expected a key "
                f"with a maximum length of {MAX_KEY}, but got a key with length {len(key)} "
                f"instead.", param="metadata")
        if len(value) > MAX_VALUE:
            raise InvalidRequestError(
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum "
                f"length {MAX_VALUE}, but got a string with length {len(value)} instead.",
                param=f"metadata.{key}")
    return metadata


def check_include(include: list[str] | None) -> frozenset[str]:
    for value in include or ():
        if value not in INCLUDABLE:
            raise InvalidRequestError(
                f"Invalid 'include': {value!r} is not one of {', '.join(sorted(INCLUDABLE))}",
                param="include")
    return frozenset(include or ())


def as_item(item: Obj) -> Obj:
    """An input item (or a response's output item) in the shape conversations list it."""
    out = dict(item)
    kind = out.get("type")
    if kind == "message":
        content = out.get("content")
        if isinstance(content, str):
            part = "output_text" if out.get("role") == "assistant" else "input_text"
            out["content"] = [{"type": part, "text": content}]
        out["content"] = [dict(p, annotations=p.get("annotations") or [])
                          if p.get("type") == "output_text" else p for p in out["content"]]
    if kind in ("message", "function_call", "function_call_output"):
        out.setdefault("status", "completed")
    return out


def _shown(item: Obj, include: frozenset[str]) -> Obj:
    """An item as a listing shows it: sealed reasoning and logprobs only when included."""
    if (item.get("type") == "reasoning" and "encrypted_content" in item
            and "reasoning.encrypted_content" not in include):
        item = {k: v for k, v in item.items() if k != "encrypted_content"}
    if (item.get("type") == "message" and "message.output_text.logprobs" not in include
            and any("logprobs" in p for p in item.get("content") or ())):
        item = dict(item, content=[{k: v for k, v in p.items() if k != "logprobs"}
                                   for p in item["content"]])
    return item


def _page(items: list[Obj], more: bool) -> Obj:
    return {"object": "list", "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": more}


class ConversationsService:
    def __init__(self, store: ConversationStore, settings: Settings, sealer: Sealer):
        self._store = store
        self._settings = settings
        self._sealer = sealer

    async def startup(self) -> None:
        """Retention, as for responses: conversations not updated within it go."""
        if self._settings.response_retention_days > 0:
            await self._store.prune(time.time() - self._settings.response_retention_days
                                    * 86400)

    def _items(self, raw: list[Obj] | None, owner: str) -> list[Obj]:
        raw = raw or []
        if len(raw) > MAX_ITEMS:
            raise InvalidRequestError(
                f"Invalid 'items': array too long. Expected an array with maximum length "
                f"{MAX_ITEMS}, but got an array with length {len(raw)} instead.",
                param="items")
        return [as_item(item) for item in normalize_input(raw, self._sealer, owner,
                                                          param="items")]

    @staticmethod
    def _missing(conversation_id: str, param: str = "conversation_id") -> NotFoundError:
        return NotFoundError(f"Conversation with id '{conversation_id}' not found.",
                             param=param)

    # -- conversations ------------------------------------------------------------------

    async def create(self, req: ConversationCreateRequest, owner: str = NO_OWNER) -> Obj:
        metadata = check_metadata(req.metadata)
        items = self._items(req.items, owner)
        return await self._store.create(new_item_id("conv"), owner, metadata, items)

    async def list_conversations(self, *, after: str | None, limit: int, order: str,
                   owner: str = NO_OWNER) -> Obj:
        """The owner's conversations, a page at a time, as OpenAI's lists are (a web page
        or a second device finds its history here)."""
        found, more = await self._store.page(owner, after=after, limit=limit, order=order)
        return _page(found, more)

    async def retrieve(self, conversation_id: str, owner: str = NO_OWNER) -> Obj:
        found = await self._store.get(conversation_id, owner)
        if found is None:
            raise self._missing(conversation_id)
        return found

    async def update(self, conversation_id: str, req: ConversationUpdateRequest,
                     owner: str = NO_OWNER) -> Obj:
        found = await self._store.update(conversation_id, owner, check_metadata(req.metadata))
        if found is None:
            raise self._missing(conversation_id)
        return found

    async def delete(self, conversation_id: str, owner: str = NO_OWNER) -> Obj:
        if not await self._store.delete(conversation_id, owner):
            raise self._missing(conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    # -- items --------------------------------------------------------------------------

    async def add_items(self, conversation_id: str, req: ItemsCreateRequest,
                        include: list[str] | None, owner: str = NO_OWNER) -> Obj:
        shown = check_include(include)
        items = self._items(req.items, owner)
        try:    # ids already in the conversation: checked in the appending transaction
            appended = await self._store.append(conversation_id, owner, items)
        except ItemIdTaken as exc:
            i = next(i for i, item in enumerate(items) if item["id"] == exc.item_id)
            raise duplicate_id(exc.item_id, f"items[{i}].id") from None
        if not appended:
            raise self._missing(conversation_id)
        return _page([_shown(item, shown) for item in items], False)

    async def list_items(self, conversation_id: str, *, after: str | None, limit: int,
                         order: str, include: list[str] | None,
                         owner: str = NO_OWNER) -> Obj:
        shown = check_include(include)
        page = await self._store.items(conversation_id, owner, after=after, limit=limit,
                                       order=order)
        if page is None:
            raise self._missing(conversation_id)
        items, more = page
        return _page([_shown(item, shown) for item in items], more)

    async def get_item(self, conversation_id: str, item_id: str, include: list[str] | None,
                       owner: str = NO_OWNER) -> Obj:
        shown = check_include(include)
        found, item = await self._store.item(conversation_id, owner, item_id)
        if not found:
            raise self._missing(conversation_id)
        if item is None:
            raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
        return _shown(item, shown)

    async def delete_item(self, conversation_id: str, item_id: str,
                          owner: str = NO_OWNER) -> Obj:
        conversation, deleted = await self._store.delete_item(conversation_id, owner, item_id)
        if conversation is None:
            raise self._missing(conversation_id)
        if not deleted:
            raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
        return conversation

    # -- for the Responses API ----------------------------------------------------------

    async def history(self, conversation_id: str, owner: str) -> list[Obj]:
        """Every item of the conversation, oldest first (404 naming ``conversation``), each
        checked as new items are (400 naming the conversation and the item)."""
        items = await self._store.all_items(conversation_id, owner)
        if items is None:
            raise self._missing(conversation_id, param="conversation")
        await off_loop(self._check_stored, conversation_id, items, owner)
        return items

    def _check_stored(self, conversation_id: str, items: list[Obj], owner: str) -> None:
        seen: set[str] = set()
        for i, item in enumerate(items):
            try:
                check_item(item, f"items[{i}]", self._sealer, owner, seen, made_here=True)
            except InvalidRequestError as exc:
                raise InvalidRequestError(
                    f"Conversation {conversation_id!r} holds an item this server cannot use "
                    f"(item {item.get('id')!r}, {exc.param}): {exc.message.rstrip('.')}. Delete "
                    f"the item to continue the conversation.", param="conversation") from None

    async def append_turn(self, conversation_id: str, owner: str, response: Obj,
                          input_items: list[Obj]) -> bool:
        """A finished response's input and output items, appended together, if its status
        is one that appends (completed, incomplete); whether anything was appended (False:
        the conversation has been deleted meanwhile, or the response did not finish)."""
        if response.get("status") not in APPENDING:
            return False
        items = [as_item(item) for item in input_items]
        items += [as_item(item) for item in response.get("output") or ()]
        try:
            return bool(items) and await self._store.append(conversation_id, owner, items)
        except ItemIdTaken as exc:     # a concurrent turn added the same input id first
            log.warning("conversation %s already holds item %r: a turn was not appended",
                        conversation_id, exc.item_id)
            return False
