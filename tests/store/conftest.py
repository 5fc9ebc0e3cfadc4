"""The store tests' databases: SQLite in a temporary directory and, when one is running,
PostgreSQL (each test in a schema of its own; without one, each PostgreSQL test is skipped
with one line saying so)."""

import os
import secrets

import pytest

from podium.store.sql import SQLStore

POSTGRES = os.environ.get("PODIUM_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def postgres_url():
    psycopg = pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg")
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError:
        pytest.skip(f"no PostgreSQL at {POSTGRES} (set PODIUM_TEST_POSTGRES)")
    schema = "podium_test_" + secrets.token_hex(6)      # each test its own tables
    admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES}?options=-csearch_path%3D{schema}"
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()


@pytest.fixture
def pg_url():
    yield from postgres_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield from postgres_url()


@pytest.fixture
def open_store(url):
    stores = []

    def build(at=url):
        stores.append(SQLStore(at))
        return stores[-1]
    yield build
    for store in stores:
        store.engine.dispose()
