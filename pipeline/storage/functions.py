"""SQL functions that each database spells its own way, as SQLAlchemy constructs that
compile to the right spelling (SQLAlchemy's public ``compiles`` extension).

``position(text, needle)``: where ``needle`` starts in ``text``, counting from 1, and 0
where it is not there; case- and accent-sensitive where the column's comparison is
(PostgreSQL and SQLite always; MariaDB with the case-sensitive collation the pipeline
requires). PostgreSQL's ``strpos`` searches about 2.6 times as fast as ``LIKE '%x%'``
on a listing's words (bench/filter_workbench.py).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

__all__ = ["position"]


class position(FunctionElement[int]):
    type = sa.Integer()
    inherit_cache = True
    name = "position"


@compiles(position)
def _strpos(element: position, compiler: Any, **kw: Any) -> str:
    return f"strpos({compiler.process(element.clauses, **kw)})"


@compiles(position, "sqlite")
@compiles(position, "mysql")
@compiles(position, "mariadb")
def _instr(element: position, compiler: Any, **kw: Any) -> str:
    return f"instr({compiler.process(element.clauses, **kw)})"
