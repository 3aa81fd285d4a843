"""The book's machinery: the chapter runner (:mod:`~.chapters`, ``python -m calnotes.book``)
and the helpers chapters share (:mod:`~.notebook`)."""

from calnotes.book.chapters import chapter_paths, resolve_chapter, run_chapter
from calnotes.book.notebook import chapter_run, glue, setup_chapter

__all__ = [
    "chapter_paths",
    "chapter_run",
    "glue",
    "resolve_chapter",
    "run_chapter",
    "setup_chapter",
]
