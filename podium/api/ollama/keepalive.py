"""Ollama's ``keep_alive``: how long a request's model stays loaded after the request.

The wire's values are parsed to seconds by podium/protocol/ollama_keepalive.py (None when
absent, ``math.inf`` for a negative one, 0 for an unload); this module applies them.

How a value applies (podium/models.py ``Models.keep_alive``): the last request to give one
sets the model's idle deadline, counted from the moment the model next goes idle (its last
request ends), and it lasts until the model is unloaded; the next load starts from the
model's own keep-alive again (its ``[[models]]`` table's ``keep-alive``, else the server's
``--keep-alive``). A pinned model (a server of one model, or ``pinned = true``) has no idle
deadline: durations and negative values leave it loaded, as its operator asked (a client
asking to keep it 5 minutes gets at least that). ``0`` is an explicit unload and unloads
any model, pinned ones included, exactly as ``POST /v1/models/{model}/unload`` does: the
next request loads it again.

Who may: every key's requests share a model, so unloading one is the operator's act. With
API keys configured, a request whose key is not an admin key (``--admin-key``) is a
tenant's, and its ``keep_alive`` is a hint that may keep the model longer, never make it go
sooner: its value counts as at least the model's own keep-alive, so its ``0`` (and ``"1ms"``)
unloads nothing and leaves the model to its own keep-alive; an empty prompt with
``keep_alive: 0`` from a tenant is refused (403 ``admin_key_required``, in Ollama's shape).
An empty prompt without it still loads the model for a tenant (``ollama run`` sends one
first): any request of its would load it. Without keys, every request is the operator's.

The interface the Ollama routes use (``/api/chat``, ``/api/generate``, ``/api/embed``); the
route says whether the request is a ``tenant``'s (``server.edge.operator``):

- ``apply(models, name, seconds, tenant=)``: after the route holds the model, the request's
  value for it (``None``: nothing to do).
- ``await load(models, name, seconds, tenant=)``: a request with an empty prompt loads the
  model (waiting for it) and sets its keep-alive (Ollama answers ``done_reason: "load"``);
  ``seconds == 0`` unloads instead.
- ``await unload(models, name, held, tenant=)``: an empty prompt with ``keep_alive: 0``
  (Ollama answers ``done_reason: "unload"``): the model is unloaded before the answer (at
  once when idle; otherwise when its other requests end), having let go of it first if this
  request holds it (``held``: the models it holds). The operator's only (403 for a tenant).
"""

from __future__ import annotations

from podium.errors import ModelNotFound, PermissionDenied
from podium.models import Entry, Models

UNLOAD_REFUSED = ("Unloading a model is the server operator's: every key's requests share "
                  "it, so it takes an admin key (--admin-key), and this request's key is not "
                  "one; a keep_alive of 0 on a request of yours leaves the model to its own "
                  "keep-alive")


def _entry(models: Models, name: str) -> Entry:
    try:
        return models.entry(name)
    except ModelNotFound as exc:
        exc.model = name            # said in Ollama's words on its routes
        raise


def apply(models: Models, name: str, seconds: float | None, *, tenant: bool) -> None:
    """The request's ``keep_alive`` (as parsed) for the model ``name`` (which the request
    holds): its idle deadline once its last request ends; 0 unloads it then (the
    operator's; a ``tenant``'s is at least the model's own). None: the model's own
    keep-alive stands."""
    if seconds is not None:
        models.keep_alive(_entry(models, name).name, seconds, tenant=tenant)


async def load(models: Models, name: str, seconds: float | None, *, tenant: bool) -> None:
    """An empty prompt's request: the model ``name`` loaded (waiting for its load), then
    kept for ``seconds`` from now (None: its own keep-alive); ``seconds == 0`` unloads it."""
    if seconds == 0:
        await unload(models, name, [], tenant=tenant)
        return
    entry = _entry(models, name)
    await models.load(entry.name)
    if seconds is not None:
        models.keep_alive(entry.name, seconds, tenant=tenant)


async def unload(models: Models, name: str, held: list[Entry], *, tenant: bool) -> None:
    """``keep_alive: 0`` with an empty prompt: the model ``name`` unloaded before the
    answer (when idle; else as soon as its other requests end). A request that holds the
    model (in ``held``) lets go of it first. 403 for a ``tenant``."""
    if tenant:
        raise PermissionDenied(UNLOAD_REFUSED)
    entry = _entry(models, name)
    if entry in held:
        held.remove(entry)
        models.release(entry)
    await models.unload_when_idle(entry.name)
