"""backend/schema.py: a new database and a migrated one have the tables the store is written
against, on SQLite and on PostgreSQL; replicas starting together migrate once; a database that
cannot be used is a one-line error."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from backend.cli import main
from backend.schema import VERSION, metadata
from backend.store import Store, Unreachable

V0_DATABASE = Path(__file__).parents[1] / "fixtures" / "store" / "retake-v0.sqlite3"


def tables(engine: sa.Engine) -> dict[str, object]:
    """Each table's columns (name, nullable), primary key and named indexes, as the database has them.
    (A key column counts as not nullable: SQLite reports an INTEGER PRIMARY KEY as nullable.)"""
    inspector = sa.inspect(engine)
    found = {}
    for name in inspector.get_table_names():
        key = set(inspector.get_pk_constraint(name)["constrained_columns"])
        columns = {(c["name"], c["nullable"] and c["name"] not in key) for c in inspector.get_columns(name)}
        found[name] = (columns, key, {i["name"] for i in inspector.get_indexes(name)})
    found.pop("retake_schema", None)
    return found


def expected() -> dict[str, object]:
    return {table.name: ({(c.name, bool(c.nullable)) for c in table.columns}, {c.name for c in table.primary_key},
                         {i.name for i in table.indexes}) for table in metadata.sorted_tables}


def test_a_new_database_has_the_tables_the_store_uses(database: Path | str) -> None:
    store = Store(database)
    assert tables(store.engine) == expected()
    store.close()


def test_a_migrated_file_has_the_tables_a_new_one_has(tmp_path: Path) -> None:
    path = tmp_path / "retake.sqlite3"
    shutil.copy(V0_DATABASE, path)
    store = Store(path)
    assert tables(store.engine) == expected()
    store.close()


def test_replicas_starting_together_migrate_once(database: Path | str) -> None:
    stores: list[Store] = []
    barrier = threading.Barrier(3)

    def start() -> None:
        barrier.wait()
        stores.append(Store(database))

    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(stores) == 3 and len({store.replica.id for store in stores}) == 3
    with stores[0].engine.connect() as conn:
        from backend.schema import version

        assert version(conn) == VERSION
    session = stores[0].create_session()
    assert all(store.has_session(session) for store in stores)
    for store in stores:
        store.close()


def test_a_database_that_cannot_be_used_is_a_one_line_error(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = f"postgresql://retake@/retake?host={tmp_path}"  # no server listens there
    with pytest.raises(Unreachable, match=re.escape(f"cannot open {nowhere}: ")):
        Store(nowhere)
    assert main(["serve", "--database", nowhere]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"retake serve: cannot open {nowhere}: ") and error.count("\n") == 1
    assert main(["serve", "--database", "mysql://someone@host/db"]) == 2
    assert capsys.readouterr().err == ("retake serve: mysql databases are not supported; use "
                                       "postgresql://user@host/db\n")
    assert main(["serve", "--database", "not a url"]) == 2
    assert capsys.readouterr().err == ("retake serve: 'not a url' is not a database URL (postgresql://user@host/db)\n")
    (tmp_path / "retake.sqlite3").write_text("not a database")
    assert main(["serve", "--data-dir", str(tmp_path)]) == 2
    garbage = tmp_path / "retake.sqlite3"
    assert capsys.readouterr().err == f"retake serve: cannot open {garbage}: file is not a database\n"
    secret = f"postgresql://retake:hunter2@/retake?host={tmp_path}"
    assert main(["serve", "--database", secret]) == 2
    assert "hunter2" not in capsys.readouterr().err  # a password never reaches the terminal or a log
