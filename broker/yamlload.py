"""YAML as Lockstep reads it (configuration files, job specs): a key written twice in one mapping is a mistake.

PyYAML keeps the last of two equal keys without a word, so a config with two ``vast:`` sections, or a spec with
``gpus`` twice, silently loses one of them. Here it is an error naming the key and both of its lines.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"


def _scalar_key(node: yaml.Node) -> Hashable | None:
    """A comparable identity of a mapping key: (tag, text) of a scalar; None for a collection or a merge key."""
    if isinstance(node, yaml.ScalarNode) and node.tag != _MERGE:
        return (node.tag, node.value)
    return None


def duplicates(node: yaml.MappingNode) -> Iterator[tuple[yaml.Node, yaml.Node]]:
    """(first, again) key nodes for each key written twice in this one mapping (not its children)."""
    seen: dict[Hashable, yaml.Node] = {}
    for key_node, _ in node.value:
        key = _scalar_key(key_node)
        if key is None:
            continue
        if key in seen:
            yield seen[key], key_node
        else:
            seen[key] = key_node


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key written twice in one mapping: ``problem`` names it and the line of its first occurrence;
    ``problem_mark`` is the second."""

    def __init__(self, first: yaml.Node, again: yaml.Node) -> None:
        self.key = str(getattr(again, "value", "?"))
        self.first_line = first.start_mark.line + 1
        self.again_line = again.start_mark.line + 1
        super().__init__(None, None, f"duplicate key {self.key!r} (first at line {self.first_line}, "
                                     f"again at line {self.again_line})", again.start_mark)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping (checked before ``<<`` merges, whose keys
    an explicit key may override by design)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        for first, again in duplicates(node):
            raise DuplicateKeyError(first, again)
        return super().construct_mapping(node, deep=deep)


def duplicate_paths(node: yaml.Node | None, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], int, int]]:
    """Every key written twice anywhere in a composed document: (key path, first line, second line)."""
    out: list[tuple[tuple[Any, ...], int, int]] = []
    todo: list[tuple[yaml.Node, tuple[Any, ...]]] = [(node, path)] if node is not None else []
    while todo:  # iterative: a deep document cannot overflow the stack here
        n, p = todo.pop()
        if isinstance(n, yaml.MappingNode):
            for first, again in duplicates(n):
                out.append(((*p, again.value), first.start_mark.line + 1, again.start_mark.line + 1))
            for key_node, value in n.value:
                if isinstance(key_node, yaml.ScalarNode):
                    todo.append((value, (*p, key_node.value)))
        elif isinstance(n, yaml.SequenceNode):
            todo.extend((item, (*p, i)) for i, item in enumerate(n.value))
    return sorted(out, key=lambda d: d[2])
