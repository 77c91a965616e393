"""Column kinds the tables share: 64-bit integers and JSON documents stored as text."""

from sqlalchemy import BigInteger, Column, Text
from sqlmodel import Field


def int64_column(index: bool = False, nullable: bool = True):
    """A 64-bit integer on every database: nanosecond timestamps, byte and token counts."""
    return Field(default=None, sa_type=BigInteger, index=index, nullable=nullable)


def json_text_column():
    """A JSON document stored as text: portable across SQLite and PostgreSQL."""
    return Field(default="{}", sa_column=Column(Text, nullable=False))
