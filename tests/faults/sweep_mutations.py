"""Seeded mutations of a sweep file, for the sweep fuzz (test_sweep_fuzz.py).

A mutation takes the shipped file's text and a random generator and returns the bytes of
a new file and whether the result must be refused (`must_fail`) or may be valid (a typo
in a comment, a truncation at a line end, a type swap that a field accepts: the tool
decides). Families: keys (renamed, dropped, added), values (types swapped, out of range,
cross-field conflicts the job would meet), sizes (axes, scalars, the file), encodings and
bytes, and YAML structure (broken punctuation, indentation, aliases, tags, bombs).
"""

from __future__ import annotations

import copy
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

Tree = dict[str, Any]


@dataclass(frozen=True)
class Mutant:
    family: str
    what: str
    data: bytes
    must_fail: bool


def _dump(tree: Any) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(tree, Dumper=dumper, sort_keys=False, allow_unicode=True, width=100)


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of the tree (mapping keys and list indices)."""
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


def _get(tree: Any, path: tuple) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _parent(tree: Any, path: tuple) -> Any:
    return _get(tree, path[:-1])


def _free_form(path: tuple) -> bool:
    """Under deepspeed.extra any key is allowed (raw DeepSpeed settings)."""
    return "extra" in path[:-1]


def _typo(rng: random.Random, word: str) -> str:
    i = rng.randrange(len(word) + 1)
    op = rng.choice(("insert", "delete", "swap", "case"))
    if op == "insert" or len(word) < 2:
        return word[:i] + rng.choice(string.ascii_lowercase) + word[i:]
    i = min(i, len(word) - 2)
    if op == "delete":
        return word[:i] + word[i + 1 :]
    if op == "swap" and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + word[i].swapcase() + word[i + 1 :] if word[i].isalpha() else word + "_"


# ---------------------------------------------------------------- keys


def rename_key(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    paths = [p for p in _paths(tree) if isinstance(p[-1], str)]
    path = rng.choice(paths)
    parent, old = _parent(tree, path), path[-1]
    new = _typo(rng, old)
    if new in parent or new == old:
        new = old + "x"
    parent[new] = parent.pop(old)
    # an unknown key, unless free-form or a dotted axis key (a typo may name another field)
    must_fail = not _free_form(path) and path[0] not in ("grid", "zip")
    return f"rename {'.'.join(map(str, path))} -> {new}", tree, must_fail


def drop_key(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    paths = [p for p in _paths(tree) if isinstance(p[-1], str)]
    path = rng.choice(paths)
    del _parent(tree, path)[path[-1]]
    return f"drop {'.'.join(map(str, path))}", tree, path in (("name",), ("base",))


def add_key(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    maps = [()] + [p for p in _paths(tree) if isinstance(_get(tree, p), dict)]
    path = rng.choice([p for p in maps if not _free_form((*p, "key"))])
    key = rng.choice(("colour", "learning_rate", "nodes", "sise", "Seed", "épocas"))
    _get(tree, path)[key] = rng.choice((1, "x", None, [1]))
    return f"add {'.'.join(map(str, (*path, key)))}", tree, True


# ---------------------------------------------------------------- values

ODD_VALUES = ["a string", "", 3.7, -1, 0, True, None, [], {}, [1, 2], {"x": 1}, "1e400"]
ODD_NUMBERS = [0, -1, -1e30, 1e30, 2**70, -(2**70), 0.5, float("nan"), float("inf")]


def swap_type(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    path = rng.choice(_paths(tree))
    value = copy.deepcopy(rng.choice(ODD_VALUES))
    _parent(tree, path)[path[-1]] = value
    return f"set {'.'.join(map(str, path))} = {value!r}", tree, False


def out_of_range(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    paths = [
        p
        for p in _paths(tree)
        if isinstance(_parent(tree, p)[p[-1]], (int, float))
        and not isinstance(_parent(tree, p)[p[-1]], bool)
    ]
    if not paths:
        return swap_type(rng, tree)
    path = rng.choice(paths)
    value = rng.choice(ODD_NUMBERS)
    _parent(tree, path)[path[-1]] = value
    return f"set {'.'.join(map(str, path))} = {value!r}", tree, False


def _unset_axes(tree: Tree, *keys: str) -> None:
    """Take `keys` off the grid and zip axes, so that base's value is the one used."""
    for axes in ("grid", "zip"):
        if isinstance(tree.get(axes), dict):
            for key in keys:
                tree[axes].pop(key, None)


def job_conflict(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    """A value that validates alone but that the job cannot run (issue 17, defect 5)."""
    base = tree.setdefault("base", {})
    for section in ("model", "data", "train"):
        if not isinstance(base.get(section), dict):
            base[section] = {}
    model, data, train = base["model"], base["data"], base["train"]
    seq = data.get("seq_len", 256)
    choice = rng.randrange(7)
    if choice == 0:
        model["block_size"] = max(2, seq // 2)
        _unset_axes(tree, "model.block_size", "data.seq_len")
        return "block_size below seq_len", tree, True
    if choice == 1:
        data["source"] = "/no/such/dir/corpus.txt"
        _unset_axes(tree, "data.source")
        return "missing local data path", tree, True
    if choice == 2:  # a text source: the synthetic tasks use no tokenizer
        data.update(source="builtin:pydoc", tokenizer="byte")
        model.update(vocab_size=100, task="lm")
        model.pop("n_classes", None)
        _unset_axes(tree, "data.source", "data.tokenizer", "model.vocab_size")
        return "vocabulary smaller than the tokenizer's", tree, True
    if choice == 3:
        train["global_batch_tokens"] = seq * 8 + 1
        _unset_axes(tree, "train.global_batch_tokens", "data.seq_len")
        return "global_batch_tokens not a multiple of seq_len", tree, True
    if choice == 4:
        base["seed"] = -1
        _unset_axes(tree, "seed")
        return "seed -1", tree, True
    if choice == 5:
        train["dtype"] = "fp16"
        _unset_axes(tree, "train.dtype")
        return "fp16 on CPU", tree, True
    tree["experiment"] = "e" * rng.choice((257, 600, 5000))
    return "experiment name too long", tree, True


def blow_up_axis(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    n = rng.choice((1_500, 5_000, 20_000))
    grid = tree.get("grid") if isinstance(tree.get("grid"), dict) else {}
    grid["seed"] = list(range(n))
    tree["grid"] = grid
    if isinstance(tree.get("zip"), dict):
        tree["zip"].pop("seed", None)
    if isinstance(tree.get("base"), dict):
        tree["base"].pop("seed", None)
    return f"grid.seed of {n:,} values", tree, True


def axis_garbage(rng: random.Random, tree: Tree) -> tuple[str, Tree, bool]:
    choice = rng.randrange(5)
    if choice == 0:
        tree["zip"] = {"seed": [0, 1, 2], "train.lr": [0.1, 0.2]}
        return "zip lists of unequal length", tree, True
    if choice == 1:
        tree["variants"] = ["dense", "dense"]
        return "a repeated variant", tree, True
    if choice == 2:
        tree["isoflop"] = {"flops": [1e12], "sizes": ["giant"]}
        return "isoflop size unknown", tree, True
    if choice == 3:
        tree["grid"] = {"model.nope": [1, 2]}
        return "grid over an unknown key", tree, True
    tree["grid"] = {"seed": []}
    return "an empty axis", tree, True


STRUCTURAL: list[Callable[[random.Random, Tree], tuple[str, Tree, bool]]] = [
    rename_key, drop_key, add_key, swap_type, out_of_range, job_conflict, blow_up_axis,
    axis_garbage,
]  # fmt: skip


# ---------------------------------------------------------------- text and bytes


def encoding(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    codec = rng.choice(("utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"))
    accents = "“naïve” décembre" if codec != "latin-1" else "naïve décembre"
    marked = text.replace("\n", f"  # {accents}\n", 1)  # not ASCII, so not UTF-8 either
    return f"encoded as {codec}", marked.encode(codec), True


def binary(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    kind = rng.randrange(4)
    if kind == 0:
        return "random bytes", rng.randbytes(rng.randrange(1, 4096)), True
    if kind == 1:
        return "a PNG header, then the text", b"\x89PNG\r\n\x1a\n\x00" + text.encode(), True
    if kind == 2:
        i = rng.randrange(len(text))
        return "a NUL byte inside", (text[:i] + "\x00" + text[i:]).encode(), True
    return "gzip magic", b"\x1f\x8b\x08\x00" + rng.randbytes(64), True


def truncate(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    i = rng.randrange(len(text))
    return f"truncated at {i}", text[:i].encode(), False


def punctuation(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    token = rng.choice(
        [":", "[", "]", "{", "}", "- ", "&a ", "*a", "!!python/object/apply:os.system ['true'] ",
         "|", ">", "%", "@", "`", '"', "'", "\t", "? ", ",", "!!binary ", "<<: *x\n", "---\n"]
    )  # fmt: skip
    i = rng.randrange(len(text) + 1)
    return f"{token!r} inserted at {i}", (text[:i] + token + text[i:]).encode(), False


def lines(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    rows = text.splitlines(keepends=True)
    i = rng.randrange(len(rows))
    op = rng.randrange(4)
    if op == 0:
        del rows[i]
        what = "line deleted"
    elif op == 1:
        rows.insert(i, rows[i])
        what = "line repeated"
    elif op == 2:
        rows[i] = " " * rng.choice((1, 2, 3)) + rows[i]
        what = "line indented"
    else:
        rows[i] = rows[i].lstrip(" ")
        what = "line dedented"
    return f"{what} ({i + 1})", "".join(rows).encode(), False


def oversize(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    n = rng.choice((20_000, 100_000, 300_000))
    shapes = [
        ("deep flow sequence", "x: " + "[" * n + "]" * n),
        ("unclosed flow mappings", "x: " + "{a: " * n),
        ("deep block sequence", "x:\n" + "".join("  " * i + "- \n" for i in range(200))),
        ("a 2 MB scalar", "x: " + "y" * 2_000_000),
        ("many nodes", "x: [" + ", ".join(["1"] * n) + "]"),
        ("an alias bomb", _bomb()),
        ("a self-referencing alias", "x: &a [*a]"),
        ("an int of 5000 digits", "x: " + "9" * 5000),
    ]
    what, extra = rng.choice(shapes)
    return what, (text.rstrip("\n") + "\n" + extra + "\n").encode(), True


def _bomb() -> str:
    rows = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        rows.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "x:\n" + "\n".join("  " + r for r in rows)


def documents(rng: random.Random, text: str) -> tuple[str, bytes, bool]:
    choice = rng.randrange(4)
    if choice == 0:
        return "empty file", b"", True
    if choice == 1:
        return "comments only", b"# nothing here\n", True
    if choice == 2:
        return "two documents", (text + "\n---\n" + text).encode(), True
    return "a list, not a mapping", b"- name: x\n- base: {}\n", True


TEXTUAL: list[Callable[[random.Random, str], tuple[str, bytes, bool]]] = [
    encoding, binary, truncate, punctuation, lines, oversize, documents,
]  # fmt: skip


def mutate(rng: random.Random, text: str) -> Mutant:
    """One mutant of `text`: a structural mutation (parsed, changed, dumped) or a textual
    one (bytes changed), half and half."""
    if rng.random() < 0.5:
        fn = rng.choice(STRUCTURAL)
        what, tree, must_fail = fn(rng, yaml.load(text, Loader=yaml.CSafeLoader))
        return Mutant(fn.__name__, what, _dump(tree).encode(), must_fail)
    fn = rng.choice(TEXTUAL)
    what, data, must_fail = fn(rng, text)
    return Mutant(fn.__name__, what, data, must_fail)
