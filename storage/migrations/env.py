"""Alembic environment: runs the migrations on the connection `storage.db.upgrade` hands over.

`storage.db.upgrade(engine)` is the normal way in. To write a new revision, change
`storage/models.py`, then let Alembic draft it against a database at head and edit the draft:

    .venv/bin/alembic -c storage/alembic.ini revision --autogenerate -m "what changed"

(the database is the `ENVLAB_DB` setting). Then check that `tests/storage/test_storage.py` still finds no
difference between the models and the head revision.
"""

from alembic import context
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

from storage.db import make_engine
from storage.models import UTCDateTime


def render_item(kind: str, obj, _autogen_context) -> str | bool:
    """Draft revisions in plain SQLAlchemy types, so that they never import the models they freeze."""
    if kind == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    if kind == "type" and isinstance(obj, AutoString):
        return "sa.String()"
    return False


def run_migrations(connection) -> None:
    # Batch mode lets SQLite alter tables by copying them; PostgreSQL alters in place.
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=True,
        render_item=render_item,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    run_migrations(connection)
else:
    with make_engine().begin() as connection:
        run_migrations(connection)
