"""Conversations API request models (``/v1/conversations``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from podium.protocol.common import LENIENT


class ConversationCreateRequest(BaseModel):
    model_config = LENIENT
    items: list[dict[str, Any]] | None = None
    metadata: dict[str, str] | None = None


class ConversationUpdateRequest(BaseModel):
    model_config = LENIENT
    metadata: dict[str, str] | None         # required, null allowed (as the SDK sends it)


class ItemsCreateRequest(BaseModel):
    model_config = LENIENT
    items: list[dict[str, Any]]
