"""Conversations on SQL: the Conversations API's objects and their ordered items.

Two tables on the response store's ``metadata`` (so they are created with the others) and
its engine: a conversation row (owner, metadata, times, and the next free item position) and
one row per item, keyed by (conversation, position). The methods run on a worker thread,
like ``SQLStore``'s, and the driver's operational failures leave as ``StoreUnavailable``.

Ownership: a conversation belongs to the API key that made it (``owner``), and every read,
listing, write and delete filters by it in SQL: another owner's conversation is as missing as one
that never was.

Appending: positions are allocated inside the appending transaction. Its first statement
moves the conversation's ``next_position`` on by the number of items (a write that holds the
row: ``FOR UPDATE`` on PostgreSQL, the database's write lock on SQLite) and the items are
inserted at the positions it freed, before the commit. Two appends to one conversation are
therefore serialized on that row: each one's items are contiguous, in the order the appends
committed. Item ids are unique within a conversation: an append whose ids are already there
(looked up while the row is held, so two appends cannot both add one) adds nothing and raises
``ItemIdTaken``. A delete of the conversation takes the same row first, so an append either lands
before it (and its items are deleted with the rest) or finds no conversation and adds
nothing.

Retention: ``prune`` removes conversations not updated (created, metadata changed, items
added or deleted) since a cut-off, with their items.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import sqlalchemy as sa

from podium.store.sql import _mapped, metadata

conversations = sa.Table(
    "podium_conversations", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False, index=True),
    sa.Column("meta", sa.Text, nullable=False),          # the metadata object, as JSON
    sa.Column("next_position", sa.Integer, nullable=False),
    # the listing's order within an owner (made at start in a database older than it)
    sa.Index("ix_podium_conversations_owner", "owner", "created_at", "id"),
)
conversation_items = sa.Table(
    "podium_conversation_items", metadata,
    sa.Column("conversation_id", sa.String(64), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("item_id", sa.String(64), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Index("ix_podium_conversation_items_item", "conversation_id", "item_id"),
)
_PRUNE_BATCH = 500          # ids per statement (SQLite bounds bound parameters)


class ItemIdTaken(Exception):
    """An appended item's id is already in the conversation (nothing was appended)."""

    def __init__(self, item_id: str):
        super().__init__(item_id)
        self.item_id = item_id

Obj = dict[str, Any]


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _conversation(row: Any) -> Obj:
    return {"id": row.id, "object": "conversation", "created_at": int(row.created_at),
            "metadata": orjson.loads(row.meta)}


class ConversationStore:
    """Conversations and their items, on the response store's engine."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        metadata.create_all(engine, tables=[conversations, conversation_items])
        _add_owner_index(engine)

    async def _run(self, fn, *args):
        with _mapped():
            return await asyncio.to_thread(fn, *args)

    # -- conversations ------------------------------------------------------------------

    async def create(self, conversation_id: str, owner: str, meta: dict[str, str],
                     items: list[Obj]) -> Obj:
        return await self._run(self._create, conversation_id, owner, meta, items)

    def _create(self, conversation_id: str, owner: str, meta: dict[str, str],
                items: list[Obj]) -> Obj:
        now = time.time()
        with self.engine.begin() as db:
            db.execute(sa.insert(conversations).values(
                id=conversation_id, owner=owner, created_at=now, updated_at=now,
                meta=_dumps(meta), next_position=len(items)))
            _insert_items(db, conversation_id, 0, items)
        return {"id": conversation_id, "object": "conversation", "created_at": int(now),
                "metadata": meta}

    async def get(self, conversation_id: str, owner: str) -> Obj | None:
        return await self._run(self._get, conversation_id, owner)

    def _get(self, conversation_id: str, owner: str) -> Obj | None:
        with self.engine.connect() as db:
            row = _row(db, conversation_id, owner)
        return None if row is None else _conversation(row)

    async def page(self, owner: str, *, after: str | None, limit: int, order: str
                   ) -> tuple[list[Obj], bool]:
        """A page of the owner's conversations by creation (``created_at``, then ``id``),
        and whether more follow. ``after`` is a conversation id (one the owner no longer
        has: from the start, as an item cursor)."""
        return await self._run(self._page, owner, after, limit, order)

    def _page(self, owner: str, after: str | None, limit: int, order: str
              ) -> tuple[list[Obj], bool]:
        c = conversations.c
        query = sa.select(c.id, c.created_at, c.meta).where(c.owner == owner)
        key = sa.tuple_(c.created_at, c.id)
        with self.engine.connect() as db:
            cursor = None if after is None else _row(db, after, owner)
            if cursor is not None:
                at = sa.tuple_(sa.literal(cursor.created_at, sa.Float), sa.literal(cursor.id))
                query = query.where(key > at if order == "asc" else key < at)
            query = query.order_by(*((c.created_at, c.id) if order == "asc"
                                     else (c.created_at.desc(), c.id.desc())))
            rows = db.execute(query.limit(limit + 1)).all()
        return [_conversation(r) for r in rows[:limit]], len(rows) > limit

    async def update(self, conversation_id: str, owner: str, meta: dict[str, str]) -> Obj | None:
        return await self._run(self._update, conversation_id, owner, meta)

    def _update(self, conversation_id: str, owner: str, meta: dict[str, str]) -> Obj | None:
        c = conversations
        with self.engine.begin() as db:
            if not db.execute(sa.update(c).where(c.c.id == conversation_id,
                                                 c.c.owner == owner).values(
                    meta=_dumps(meta), updated_at=time.time())).rowcount:
                return None
            row = _row(db, conversation_id, owner)
        return None if row is None else _conversation(row)

    async def delete(self, conversation_id: str, owner: str) -> bool:
        return await self._run(self._delete, conversation_id, owner)

    def _delete(self, conversation_id: str, owner: str) -> bool:
        c, t = conversations, conversation_items
        with self.engine.begin() as db:
            # the row first: an append in flight finishes before (its items go too), and a
            # later one finds no conversation
            if not db.execute(sa.delete(c).where(c.c.id == conversation_id,
                                                 c.c.owner == owner)).rowcount:
                return False
            db.execute(sa.delete(t).where(t.c.conversation_id == conversation_id))
        return True

    # -- items --------------------------------------------------------------------------

    async def append(self, conversation_id: str, owner: str, items: list[Obj]) -> bool:
        """Add items at the end, together, in one transaction; False (nothing added) if the
        owner has no such conversation."""
        return await self._run(self._append, conversation_id, owner, items)

    def _append(self, conversation_id: str, owner: str, items: list[Obj]) -> bool:
        c = conversations
        with self.engine.begin() as db:
            # the first statement is the write that holds the row until commit
            if not db.execute(sa.update(c).where(c.c.id == conversation_id,
                                                 c.c.owner == owner).values(
                    next_position=c.c.next_position + len(items),
                    updated_at=time.time())).rowcount:
                return False
            _check_new(db, conversation_id, [item["id"] for item in items])
            end = db.execute(sa.select(c.c.next_position).where(
                c.c.id == conversation_id)).scalar_one()
            _insert_items(db, conversation_id, end - len(items), items)
        return True

    async def all_items(self, conversation_id: str, owner: str) -> list[Obj] | None:
        """Every item, oldest first; None if the owner has no such conversation."""
        return await self._run(self._all_items, conversation_id, owner)

    def _all_items(self, conversation_id: str, owner: str) -> list[Obj] | None:
        t = conversation_items
        with self.engine.connect() as db:
            if _row(db, conversation_id, owner) is None:
                return None
            rows = db.execute(sa.select(t.c.body).where(
                t.c.conversation_id == conversation_id).order_by(t.c.position)).all()
        return [orjson.loads(r.body) for r in rows]

    async def items(self, conversation_id: str, owner: str, *, after: str | None, limit: int,
                    order: str) -> tuple[list[Obj], bool] | None:
        """A page of items and whether more follow; None if there is no such conversation.
        ``after`` is an item id (an unknown one: from the start)."""
        return await self._run(self._items, conversation_id, owner, after, limit, order)

    def _items(self, conversation_id: str, owner: str, after: str | None, limit: int,
               order: str) -> tuple[list[Obj], bool] | None:
        t = conversation_items
        query = sa.select(t.c.body).where(t.c.conversation_id == conversation_id)
        with self.engine.connect() as db:
            if _row(db, conversation_id, owner) is None:
                return None
            if after is not None:
                pos = db.execute(sa.select(sa.func.min(t.c.position)).where(
                    t.c.conversation_id == conversation_id, t.c.item_id == after)).scalar()
                if pos is not None:
                    query = query.where(t.c.position > pos if order == "asc"
                                        else t.c.position < pos)
            query = query.order_by(t.c.position.asc() if order == "asc"
                                   else t.c.position.desc())
            rows = db.execute(query.limit(limit + 1)).all()
        return [orjson.loads(r.body) for r in rows[:limit]], len(rows) > limit

    async def item(self, conversation_id: str, owner: str, item_id: str
                   ) -> tuple[bool, Obj | None]:
        """(whether the conversation exists, the item or None)."""
        return await self._run(self._item, conversation_id, owner, item_id)

    def _item(self, conversation_id: str, owner: str, item_id: str) -> tuple[bool, Obj | None]:
        t = conversation_items
        with self.engine.connect() as db:
            if _row(db, conversation_id, owner) is None:
                return False, None
            body = db.execute(sa.select(t.c.body).where(
                t.c.conversation_id == conversation_id, t.c.item_id == item_id).order_by(
                t.c.position).limit(1)).scalar()
        return True, None if body is None else orjson.loads(body)

    async def delete_item(self, conversation_id: str, owner: str, item_id: str
                          ) -> tuple[Obj | None, bool]:
        """(the conversation or None if missing, whether the item was there and is gone)."""
        return await self._run(self._delete_item, conversation_id, owner, item_id)

    def _delete_item(self, conversation_id: str, owner: str, item_id: str
                     ) -> tuple[Obj | None, bool]:
        c, t = conversations, conversation_items
        with self.engine.begin() as db:
            if not db.execute(sa.update(c).where(c.c.id == conversation_id,
                                                 c.c.owner == owner).values(
                    updated_at=time.time())).rowcount:
                return None, False
            deleted = db.execute(sa.delete(t).where(
                t.c.conversation_id == conversation_id, t.c.item_id == item_id)).rowcount
            row = _row(db, conversation_id, owner)
        return (None if row is None else _conversation(row)), bool(deleted)

    # -- housekeeping -------------------------------------------------------------------

    async def prune(self, older_than: float) -> int:
        return await self._run(self._prune, older_than)

    def _prune(self, older_than: float) -> int:
        """Conversations not updated since ``older_than`` (epoch seconds), with their items;
        how many. Each old row is held while it goes, so an append racing the prune either
        lands first (and keeps the conversation: it is no longer old) or finds it gone."""
        c, t = conversations, conversation_items
        with self.engine.begin() as db:
            ids = [r.id for r in db.execute(sa.select(c.c.id).where(
                c.c.updated_at < older_than).with_for_update()).all()]
            gone = 0
            for i in range(0, len(ids), _PRUNE_BATCH):
                batch = ids[i:i + _PRUNE_BATCH]
                gone += db.execute(sa.delete(c).where(c.c.id.in_(batch),
                                                      c.c.updated_at < older_than)).rowcount
                # the items of those that went (one updated meanwhile stays, whole)
                db.execute(sa.delete(t).where(t.c.conversation_id.in_(batch), ~sa.exists(
                    sa.select(c.c.id).where(c.c.id == t.c.conversation_id))))
        return gone


def _row(db: sa.Connection, conversation_id: str, owner: str) -> Any:
    c = conversations
    return db.execute(sa.select(c.c.id, c.c.created_at, c.c.meta).where(
        c.c.id == conversation_id, c.c.owner == owner)).first()


def _check_new(db: sa.Connection, conversation_id: str, ids: list[str]) -> None:
    """ItemIdTaken (the transaction rolls back) if one of ``ids`` is in the conversation."""
    t = conversation_items
    for i in range(0, len(ids), _PRUNE_BATCH):
        taken = db.execute(sa.select(t.c.item_id).where(
            t.c.conversation_id == conversation_id,
            t.c.item_id.in_(ids[i:i + _PRUNE_BATCH])).limit(1)).scalar()
        if taken is not None:
            raise ItemIdTaken(taken)


def _insert_items(db: sa.Connection, conversation_id: str, start: int, items: list[Obj]) -> None:
    if items:
        db.execute(sa.insert(conversation_items), [
            {"conversation_id": conversation_id, "position": start + i, "item_id": item["id"],
             "body": _dumps(item)} for i, item in enumerate(items)])


def _add_owner_index(engine: sa.Engine) -> None:
    """The listing's index, in a database made before it (replicas starting together: one
    makes it, the others find it made)."""
    index = next(i for i in conversations.indexes if i.name == "ix_podium_conversations_owner")
    try:
        index.create(engine, checkfirst=True)
    except sa.exc.DBAPIError:
        if index.name not in {i["name"] for i in sa.inspect(engine).get_indexes(
                conversations.name)}:
            raise
