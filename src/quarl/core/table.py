"""The cell values and rows of quarl's tables (terminal, CSV, Markdown, JSON), typed for every
layer that builds one."""

from __future__ import annotations

CellValue = str | float | int | None
"""One table cell: a label, a number, or empty (``""``; None in JSON)."""
Row = dict[str, CellValue]
"""One table row, column name -> cell, in column order."""
