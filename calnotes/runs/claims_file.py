"""Safe reading of a claims file: YAML with limits, so that a small or careless file cannot
take the process's memory or stack, and every problem names the file (and, where it lies
inside one, the claim).

What :func:`read_claims_yaml` refuses, each with a ``ValueError`` naming the file:

- a file larger than ``MAX_BYTES``, or bytes that are not UTF-8 (the position is named);
- YAML that nests deeper than ``MAX_DEPTH`` (mappings and sequences inside each other);
- a document whose tree, with every alias expanded, has more than ``MAX_NODES`` nodes
  (the "billion laughs": ``n`` aliases of aliases expand to ``2^n`` nodes although the
  file is tiny); the size is counted on the composed node graph, ``size(node) = 1 +
  sum(size(child))`` with each node counted once per reference, without expanding it;
- a key given twice in one mapping (YAML itself keeps the last one silently);
- any tag other than YAML's plain types (``!!python/...`` and the like), as ``safe_load``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "nonfinite", "read_claims_yaml"]

#: Largest claims file read, in bytes (the book's largest is about 30 kB).
MAX_BYTES = 1_000_000
#: Deepest nesting of mappings and sequences (a claims file needs about 6).
MAX_DEPTH = 32
#: Most nodes of a document with every alias expanded.
MAX_NODES = 200_000


class _LimitError(Exception):
    """A limit of the loader, raised from inside PyYAML's composer or constructor."""

    def __init__(self, message: str, mark: Any = None) -> None:
        super().__init__(message)
        self.mark = mark


def _where(mark: Any) -> str:
    return "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"


class _Loader(yaml.SafeLoader):
    """SafeLoader with a depth limit while composing and duplicate keys refused."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _LimitError(f"nests deeper than {MAX_DEPTH} levels (the limit)",
                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise _LimitError(f"key {key!r} is given twice in one mapping (first "
                                          f"at {_where(seen[key])[2:-1]}); YAML would keep "
                                          f"the last silently", key_node.start_mark)
                    seen[key] = key_node.start_mark
                except TypeError:
                    pass  # an unhashable key: the constructor says so
        return super().construct_mapping(node, deep=deep)


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(node: Any, memo: dict[int, int]) -> int:
    """Nodes of ``node``'s tree with every alias expanded (capped at ``MAX_NODES + 1``),
    computed once per node object and without recursion; a recursive alias (a cycle)
    counts as too many."""
    active: set[int] = set()
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        cur, done = stack.pop()
        if done:
            active.discard(id(cur))
            memo[id(cur)] = min(1 + sum(memo[id(c)] for c in _children(cur)), MAX_NODES + 1)
            continue
        if id(cur) in memo:
            continue
        if id(cur) in active:
            memo[id(cur)] = MAX_NODES + 1
            continue
        active.add(id(cur))
        stack.append((cur, True))
        for child in _children(cur):
            if id(child) in active:  # a cycle
                memo[id(child)] = MAX_NODES + 1
            elif id(child) not in memo:
                stack.append((child, False))
    return memo[id(node)]


def _claim_of(item: Any) -> str:
    """``claim 'ID'`` of a claims-list item node, or its position."""
    if isinstance(item, yaml.MappingNode):
        for k, v in item.value:
            if isinstance(k, yaml.ScalarNode) and k.value == "id" and isinstance(
                    v, yaml.ScalarNode):
                return f"claim {v.value!r}"
    return "a claim"


def _spans(node: Any, mark: Any) -> bool:
    return bool(node.start_mark.index <= mark.index < max(node.end_mark.index,
                                                          node.start_mark.index + 1))


def _context(root: Any, mark: Any) -> str:
    """``claim 'ID': `` or ``arm 'NAME': `` of the place ``mark`` in the document."""
    if mark is None or not isinstance(root, yaml.MappingNode):
        return ""
    for k, v in root.value:
        if not isinstance(k, yaml.ScalarNode) or not (_spans(k, mark) or _spans(v, mark)):
            continue
        if k.value == "claims" and isinstance(v, yaml.SequenceNode):
            for item in v.value:
                if _spans(item, mark):
                    return f"{_claim_of(item)}: "
        if k.value == "arms" and isinstance(v, yaml.MappingNode):
            for name, arm in v.value:
                if isinstance(name, yaml.ScalarNode) and (_spans(name, mark)
                                                          or _spans(arm, mark)):
                    return f"arm {name.value!r}: "
        return f"{k.value}: "
    return ""


_ID_LINE = re.compile(r"^\s*-\s+id:\s*['\"]?([^'\"\s#]+)")
_TOP_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:")
_ARM_KEY = re.compile(r"^\s+([\w.-]+)\s*:")


def _context_text(text: str, mark: Any) -> str:
    """The claim, arm or section at ``mark`` read from the lines above it: for errors met
    before the document is composed (its nodes are then not there to ask)."""
    if mark is None:
        return ""
    claim = arm = None
    for line in reversed(text.splitlines()[:mark.line + 1]):
        top = _TOP_KEY.match(line)
        if top:
            if top.group(1) == "claims" and claim:
                return f"claim {claim!r}: "
            if top.group(1) == "arms" and arm:
                return f"arm {arm!r}: "
            return f"{top.group(1)}: "
        found = _ID_LINE.match(line)
        claim = claim or (found.group(1) if found else None)
        key = _ARM_KEY.match(line)
        if arm is None and key and line.startswith("  ") and not line.startswith("   "):
            arm = key.group(1)
    return ""


def _check_size(path: Path, root: Any) -> None:
    memo: dict[int, int] = {}
    if _expanded_size(root, memo) <= MAX_NODES:
        return
    where = "the file"
    if isinstance(root, yaml.MappingNode):  # name the claim or section that is too large
        for k, v in root.value:
            if _expanded_size(v, memo) <= MAX_NODES:
                continue
            where = f"section {k.value!r}" if isinstance(k, yaml.ScalarNode) else where
            if isinstance(k, yaml.ScalarNode) and k.value == "claims" and isinstance(
                    v, yaml.SequenceNode):
                for item in v.value:
                    if _expanded_size(item, memo) > MAX_NODES:
                        where = _claim_of(item)
                        break
            break
    raise ValueError(f"{path}: {where}: expands to more than {MAX_NODES} YAML nodes with "
                     f"its aliases (the limit; an alias bomb?)")


def nonfinite(value: Any, name: str = "") -> str | None:
    """What is wrong where ``value`` (a YAML value: mappings, lists, scalars) holds a number
    that is NaN or infinite (``.nan``, ``.inf``), e.g. ``"gamma is nan"``; None if none."""
    stack: list[tuple[str, Any]] = [(name, value)]
    while stack:
        where, cur = stack.pop()
        if isinstance(cur, float) and not math.isfinite(cur):
            return f"{where or 'a value'} is {cur}, not a finite number"
        if isinstance(cur, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in cur.items())
        elif isinstance(cur, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(cur))
    return None


def read_claims_yaml(path: str | Path) -> Any:
    """The YAML document of the claims file at ``path``, read within the limits above."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ValueError(f"{path}: cannot read the claims file ({err})") from err
    if size > MAX_BYTES:
        raise ValueError(f"{path}: {size} bytes, larger than the {MAX_BYTES} bytes a claims "
                         f"file may have")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path}: cannot read the claims file ({err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"{path}: not UTF-8 (byte {err.start}, line {line}: "
                         f"{raw[err.start:err.start + 1]!r}); save the file as UTF-8") from err
    loader = _Loader(text)
    root = None
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_size(path, root)
        return loader.construct_document(root)
    except _LimitError as err:
        where = _context(root, err.mark) if root is not None else _context_text(text, err.mark)
        raise ValueError(f"{path}: {where}{err}{_where(err.mark)}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from err
    except RecursionError as err:  # not expected within MAX_DEPTH; never a traceback
        raise ValueError(f"{path}: nests too deeply to read") from err
    finally:
        loader.dispose()
