"""YAML read safely: size, alias-expansion and nesting bounded; line numbers for messages.

Suite and policy files can arrive in a pull request, so they are read with PyYAML's safe
loader under limits that refuse a billion-laughs alias bomb or a 100k-deep list in
milliseconds (``load_yaml_bounded``), and errors name the line (``line_of``, ``path_str``).

Ground floor: imports only ``gatekeeper.files``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gatekeeper.files import TooLarge, read_limited

# A suite is a few dozen keys nested a few levels; these limits are 100x that and still refuse
# billion-laughs alias bombs and nesting that would exhaust the stack, while composing.
MAX_YAML_NODES = 100_000  # nodes after expanding every alias
MAX_YAML_DEPTH = 64  # nesting of mappings and lists
# The demo suite is 2 KB and a 500-task suite about 100 KB. PyYAML's pure-Python parser takes
# seconds per MB, so a larger file is refused before it is read whole or parsed.
MAX_YAML_BYTES = 256 << 10


class YAMLLimitError(yaml.composer.ComposerError):
    """A suite or policy file over ``MAX_YAML_BYTES``, ``MAX_YAML_NODES`` (aliases expanded)
    or ``MAX_YAML_DEPTH``; ``problem_mark`` is set except for the size."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts, while composing, each node's size with aliases expanded (sizes
    are memoized per node, so counting costs one pass over the text, not over the expansion)
    and the nesting depth, and stops at the first node over a limit: a 684-byte alias bomb or
    a 100k-deep list is refused in milliseconds, before any walk over the document."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._total = 0  # nodes composed so far, each alias counted as the size of its anchor
        self._sizes: dict[int, int] = {}  # id(node) -> its size with aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = self.anchors.get(anchor)
            if node is not None and id(node) not in self._sizes:  # an alias inside its own anchor
                raise YAMLLimitError(None, None, f"alias *{anchor} refers to a node that contains it "
                                     "(a recursive structure); write the values out", mark)
            node = super().compose_node(parent, index)
            self._count(self._sizes[id(node)], mark)
            return node
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep", mark)
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._sizes[id(node)] = 1 + sum(self._sizes[id(n)] for n in _children(node))
        self._count(1, mark)
        return node

    def _count(self, nodes: int, mark: Any) -> None:
        self._total += nodes
        if self._total > MAX_YAML_NODES:
            raise YAMLLimitError(None, None, f"more than {MAX_YAML_NODES} values once its aliases (*name) "
                                 "are expanded (an alias bomb?); write the values out", mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_depth_fast(text: str) -> None:
    """Nesting depth from libyaml's event stream (C, no recursion), when PyYAML has it: the
    pure-Python scanner needs about 0.5 s to reach the first 64 levels of ``[[[[...``, because
    every ``[`` may start a key and is looked ahead for. Syntax errors are left to the
    pure-Python loader, whose messages the rest of gatekeeper formats."""
    if not getattr(yaml, "__with_libyaml__", False):
        return
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.CSafeLoader):
            if isinstance(event, _OPEN_EVENTS):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                         event.start_mark)
            elif isinstance(event, _CLOSE_EVENTS):
                depth -= 1
    except YAMLLimitError:
        raise
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" in str(exc.problem):  # libyaml's own limit, met while scanning ahead
            raise YAMLLimitError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                                 exc.problem_mark) from None
    except yaml.YAMLError:
        pass


def load_yaml_bounded(text: str) -> tuple[Any, yaml.Node | None]:
    """(data, node tree) of one YAML document with the safe loader, refusing documents over
    the size and depth limits (``YAMLLimitError``, a ``yaml.MarkedYAMLError`` with the line)."""
    if len(text) > MAX_YAML_BYTES:
        raise YAMLLimitError(None, None, f"larger than {MAX_YAML_BYTES >> 10} KiB; a suite or policy file is "
                             "a few KB", None)
    _check_depth_fast(text)
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        return (loader.construct_document(root) if root is not None else None), root
    finally:
        loader.dispose()


def read_bounded(path: Path) -> str:
    """The text of a suite or policy file, reading at most ``MAX_YAML_BYTES`` + 1 bytes (so a
    huge or endless file costs nothing); raises OSError, UnicodeDecodeError, YAMLLimitError."""
    try:
        raw = read_limited(path, MAX_YAML_BYTES)
    except TooLarge:
        raise YAMLLimitError(None, None, f"larger than {MAX_YAML_BYTES >> 10} KiB; a suite or policy file is "
                             "a few KB", None) from None
    return raw.decode("utf-8")


def node_at(root: yaml.Node | None, where: tuple) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) for a path; the deepest existing node when the path runs out."""
    key_node, node = None, root
    for part in where:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and _key_eq(k, part)]
            if not match:
                break
            key_node, node = match[-1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            key_node, node = None, node.value[part]
        else:
            break
    return key_node, node


def _key_eq(node: yaml.ScalarNode, part: Any) -> bool:
    if node.value == str(part):
        return True
    try:  # a non-string key (1, true) as YAML resolved it
        return yaml.safe_load(node.value) == part
    except yaml.YAMLError:
        return False


def line_of(root: yaml.Node | None, where: tuple, key_line: bool = False) -> int:
    key_node, node = node_at(root, where)
    target = key_node if (key_line and key_node is not None) else node
    return target.start_mark.line + 1 if target is not None else 1


def path_str(where: tuple) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
