"""The throwaway PostgreSQL server of the tests (tests.postgres_server) and its fixtures."""

from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest


def user_tables(connection: psycopg.Connection) -> list[str]:
    return [row[0] for row in connection.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")]


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_an_empty_database_of_its_own(run, postgres_url, postgres_server):
    # Both runs assert emptiness and then write: whichever runs second would see the first one's table
    # if the fixture handed out a shared database.
    with psycopg.connect(postgres_url) as connection:
        assert user_tables(connection) == []
        connection.execute("CREATE TABLE marker (run int)")
        connection.execute("INSERT INTO marker VALUES (%s)", (run,))
    other = postgres_server.create_database(f"other_{run}")
    try:
        with psycopg.connect(other) as connection:
            assert user_tables(connection) == []
    finally:
        postgres_server.drop_database(f"other_{run}")


def test_socket_and_tcp_reach_the_same_database_from_another_process(postgres_url, postgres_server):
    name = postgres_url.split("?")[0].rsplit("/", 1)[1]
    tcp_url = postgres_server.url(name, tcp=True)
    with psycopg.connect(postgres_url) as over_socket:
        assert over_socket.execute("SELECT inet_server_addr()").fetchone() == (None,)  # a unix socket
        over_socket.execute("CREATE TABLE writes (source text)")
    # Another process (as a proxy replica would be) writes over TCP...
    script = ("import sys, psycopg\n"
              "with psycopg.connect(sys.argv[1]) as c:\n"
              "    assert str(c.execute('SELECT inet_server_addr()').fetchone()[0]) == '127.0.0.1'\n"
              "    c.execute(\"INSERT INTO writes VALUES ('child over tcp')\")\n")
    subprocess.run([sys.executable, "-c", script, tcp_url], check=True, timeout=60)
    # ...and this one reads it over the socket.
    with psycopg.connect(postgres_url) as over_socket:
        assert over_socket.execute("SELECT source FROM writes").fetchall() == [("child over tcp",)]


def test_two_connections_see_each_others_committed_rows_only(postgres_url):
    with psycopg.connect(postgres_url) as first, psycopg.connect(postgres_url) as second:
        first.execute("CREATE TABLE rows (n int)")
        first.commit()
        first.execute("INSERT INTO rows VALUES (1)")
        assert second.execute("SELECT n FROM rows").fetchall() == []  # not committed yet
        first.commit()
        assert second.execute("SELECT n FROM rows").fetchall() == [(1,)]
        second.execute("INSERT INTO rows VALUES (2)")
        second.commit()
        assert first.execute("SELECT n FROM rows ORDER BY n").fetchall() == [(1,), (2,)]


def test_archive_backend_gives_each_backend_once(archive_backend):
    kind, url = archive_backend
    if kind == "sqlite":
        assert url is None
    else:
        assert kind == "postgresql"
        with psycopg.connect(url) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
