"""Column kinds the tables share: 64-bit integers and JSON documents stored as text."""

from sqlalchemy import BigInteger, Column, Table, Text
from sqlmodel import Field, SQLModel


def int64_column(index: bool = False, nullable: bool = True):
    """A 64-bit integer on every database: nanosecond timestamps, byte and token counts."""
    return Field(default=None, sa_type=BigInteger, index=index, nullable=nullable)


def json_text_column():
    """A JSON document stored as text: portable across SQLite and PostgreSQL."""
    return Field(default="{}", sa_column=Column(Text, nullable=False))


def table_of(model: type[SQLModel]) -> Table:
    """A table model's Table: SQLModel sets __table__ on each class made with table=True, and
    its type declarations leave that attribute out."""
    table = model.__table__  # type: ignore[attr-defined]  # sqlmodel does not declare it
    assert isinstance(table, Table)
    return table
