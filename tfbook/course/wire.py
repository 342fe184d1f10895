"""Plain-data wire format between a sandboxed submission and the grader.

The sandbox (:mod:`tfbook.course.driver`) turns the values a student's code produced
into JSON with :func:`encode`: ``None``, booleans, integers, floats, complex numbers,
strings, tuples, lists, sets and dicts of these, NumPy arrays and scalars (numeric or boolean
dtypes, stored with ``np.save``) and torch tensors (stored as their NumPy array and
their dtype). Anything else (a function, a module, an object of a student's class)
cannot be encoded: :class:`Unencodable` names its type.

The grader reads that JSON with :func:`decode`, which trusts nothing: a depth limit, a
size limit, ``np.load(..., allow_pickle=False)`` (so no object arrays and no pickles)
and a list of torch dtypes. No student bytes are ever unpickled by the grader.

Decoding costs time linear in the message's size: no set or dict is built from the data here
(integers that all hash alike would make that quadratic, and the grader's own process would
pay); sets and dicts come out as :class:`SetOf` and :class:`DictOf`, plain lists of their
items, bounded in number (``MAX_HASHED``), which the judge (a separate process whose CPU time
is limited) turns into sets and dicts.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math
import re

import numpy as np

MAX_DEPTH = 16
MAX_STR = 10_000
MAX_BYTES = 32 * 2**20  # all arrays of one value together
MAX_HASHED = 4096  # items of all the sets and dicts in one value together (their hashing: the judge's)
TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                "uint8", "bool", "complex64", "complex128")


class Unencodable(TypeError):
    """A value the wire format cannot carry (its type is in the message)."""


class Undecodable(ValueError):
    """Data from a sandbox that is not a well-formed encoded value."""


class Tensor:
    """A torch tensor as the grader receives it: its array and its torch dtype name.

    The grader's judge turns it back into a tensor (``to_torch``); nothing else
    about the student's tensor object crosses the wire.
    """

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: str):
        self.array, self.dtype = array, dtype

    def to_torch(self):
        import torch

        t = torch.from_numpy(np.array(self.array, copy=True))
        return t.to(getattr(torch, self.dtype))


class SetOf:
    """A set (or frozenset) as the grader receives it: its items, in a list (no hashing here)."""

    __slots__ = ("items", "frozen")

    def __init__(self, items: list, frozen: bool = False):
        self.items, self.frozen = items, frozen

    def build(self, native=lambda x: x):
        items = [native(i) for i in self.items]
        return frozenset(items) if self.frozen else set(items)


class DictOf:
    """A dict as the grader receives it: its (key, value) pairs, in a list (no hashing here)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list):
        self.pairs = pairs

    def build(self, native=lambda x: x) -> dict:
        return {native(k): native(v) for k, v in self.pairs}


def safe_type_name(x) -> str:
    """A type name fit for a message: builtin, NumPy and torch names as they are,
    anything else (a student's class name could carry data) as ``an object``."""
    t = type(x)
    mod = t.__module__ or ""
    if mod in ("builtins", "numpy") or mod.startswith(("numpy.", "torch")):
        name = t.__name__
        return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,40}", name) else "an object"
    return "an object"


def _npy(a: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode(x, _depth: int = 0, _budget: list | None = None):
    """``x`` as JSON-ready data; raises :class:`Unencodable` for anything else."""
    budget = [MAX_BYTES] if _budget is None else _budget
    if _depth > MAX_DEPTH:
        raise Unencodable("nested too deeply")
    if x is None or isinstance(x, bool):
        return {"t": "none"} if x is None else {"t": "bool", "v": x}
    if isinstance(x, int):
        return {"t": "int", "v": str(int(x))}
    if isinstance(x, float):
        return {"t": "float", "v": repr(float(x))}
    if isinstance(x, complex):
        return {"t": "complex", "v": [repr(x.real), repr(x.imag)]}
    if isinstance(x, str):
        if len(x) > MAX_STR:
            raise Unencodable(f"a string of {len(x)} characters")
        return {"t": "str", "v": str(x)}
    if isinstance(x, (tuple, list)):
        return {"t": "tuple" if isinstance(x, tuple) else "list",
                "v": [encode(i, _depth + 1, budget) for i in x]}
    if isinstance(x, (set, frozenset)):
        return {"t": "frozenset" if isinstance(x, frozenset) else "set",
                "v": [encode(i, _depth + 1, budget) for i in x]}
    if isinstance(x, dict):
        items = []
        for k, v in x.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise Unencodable("a dict with keys that are not strings or integers")
            items.append([encode(k, _depth + 1, budget), encode(v, _depth + 1, budget)])
        return {"t": "dict", "v": items}
    mod = type(x).__module__ or ""
    if mod.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype"):
        t = x.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        if dtype not in TORCH_DTYPES:
            raise Unencodable(f"a tensor of dtype {dtype}")
        if dtype == "bfloat16":
            t = t.float()
        arr = np.ascontiguousarray(t.numpy())
        budget[0] -= arr.nbytes
        if budget[0] < 0:
            raise Unencodable("arrays larger than 32 MiB")
        return {"t": "tensor", "dtype": dtype, "npy": _npy(arr)}
    if isinstance(x, (np.ndarray, np.generic)):
        arr = np.asarray(x)
        if arr.dtype.hasobject or arr.dtype.kind not in "biufcSU":
            raise Unencodable(f"an array of dtype {arr.dtype}")
        budget[0] -= arr.nbytes
        if budget[0] < 0:
            raise Unencodable("arrays larger than 32 MiB")
        return {"t": "scalar" if isinstance(x, np.generic) else "ndarray", "npy": _npy(arr)}
    raise Unencodable(safe_type_name(x))


def _float(s) -> float:
    if not isinstance(s, str) or len(s) > 40:
        raise Undecodable("bad float")
    v = float(s)  # accepts 'nan', 'inf'
    return v


def _load_npy(s) -> np.ndarray:
    if not isinstance(s, str) or len(s) > MAX_BYTES * 4 // 3 + 1024:
        raise Undecodable("bad array")
    try:
        arr = np.load(io.BytesIO(base64.b64decode(s, validate=True)), allow_pickle=False)
    except Exception as exc:  # noqa: BLE001  (whatever the bytes were, they are not an array)
        raise Undecodable(f"bad array ({type(exc).__name__})") from None
    if not isinstance(arr, np.ndarray) or arr.dtype.hasobject or arr.dtype.kind not in "biufcSU":
        raise Undecodable("bad array")
    # degenerate arrays cost the grader work out of proportion to their bytes (a 145-byte file
    # can say "10^12 elements of zero bytes each"): refused
    if arr.dtype.itemsize == 0 or arr.size > MAX_BYTES:
        raise Undecodable("bad array (degenerate size)")
    return arr


def decode(d, _depth: int = 0, _hashed: list | None = None):
    """The value that :func:`encode` encoded, sets and dicts as :class:`SetOf` and
    :class:`DictOf`; raises :class:`Undecodable` on anything else. Linear time: nothing hashed."""
    hashed = [MAX_HASHED] if _hashed is None else _hashed
    if _depth > MAX_DEPTH + 1 or not isinstance(d, dict):
        raise Undecodable("not an encoded value")
    t, v = d.get("t"), d.get("v")
    if t == "none":
        return None
    if t == "bool" and isinstance(v, bool):
        return v
    if t == "int" and isinstance(v, str) and re.fullmatch(r"-?\d{1,4300}", v):
        return int(v)
    if t == "float":
        return _float(v)
    if t == "complex" and isinstance(v, list) and len(v) == 2:
        return complex(_float(v[0]), _float(v[1]))
    if t == "str" and isinstance(v, str) and len(v) <= MAX_STR:
        return v
    if t in ("tuple", "list") and isinstance(v, list):
        items = [decode(i, _depth + 1, hashed) for i in v]
        return tuple(items) if t == "tuple" else items
    if t in ("set", "frozenset") and isinstance(v, list):
        hashed[0] -= len(v)
        if hashed[0] < 0:
            raise Undecodable(f"sets and dicts of more than {MAX_HASHED} items")
        items = [decode(i, _depth + 1, hashed) for i in v]
        if not all(_hashable(i) for i in items):
            raise Undecodable("unhashable set items")
        return SetOf(items, frozen=t == "frozenset")
    if t == "dict" and isinstance(v, list):
        hashed[0] -= len(v)
        if hashed[0] < 0:
            raise Undecodable(f"sets and dicts of more than {MAX_HASHED} items")
        pairs = []
        for pair in v:
            if not isinstance(pair, list) or len(pair) != 2:
                raise Undecodable("bad dict")
            k = decode(pair[0], _depth + 1, hashed)
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise Undecodable("bad dict key")
            pairs.append((k, decode(pair[1], _depth + 1, hashed)))
        return DictOf(pairs)
    if t == "ndarray":
        return _load_npy(d.get("npy"))
    if t == "scalar":
        arr = _load_npy(d.get("npy"))
        if arr.shape != ():
            raise Undecodable("bad scalar")
        return arr[()]
    if t == "tensor" and d.get("dtype") in TORCH_DTYPES:
        return Tensor(_load_npy(d.get("npy")), d["dtype"])
    raise Undecodable(f"unknown kind {str(t)[:20]!r}")


def _hashable(x, depth: int = 0) -> bool:
    """Whether a decoded tuple could be a set item (its items are; no hashing done here)."""
    if depth > MAX_DEPTH + 1:
        return False
    if isinstance(x, tuple):
        return all(_hashable(i, depth + 1) for i in x)
    if isinstance(x, SetOf):
        return x.frozen and all(_hashable(i, depth + 1) for i in x.items)
    return not isinstance(x, (list, dict, DictOf, np.ndarray, Tensor))


def finite_float(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------- digests and in-place changes
# Shared by the sandbox (it labels the calls it answered) and the judge (it matches them).


def _digest_into(h, x, depth=0) -> None:
    if depth > 20:
        h.update(b"deep")
        return
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.ascontiguousarray(x)
        h.update(f"nd{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    elif type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype"):
        t = x.detach().cpu()
        h.update(f"t{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.float().numpy().tobytes() if "bfloat16" in str(t.dtype) else t.numpy().tobytes())
    elif hasattr(x, "state_dict") and callable(x.state_dict):
        h.update(type(x).__name__.encode())
        for k, v in x.state_dict().items():
            h.update(k.encode())
            _digest_into(h, v, depth + 1)
    elif isinstance(x, (list, tuple)):
        # a list and a tuple with the same items are the same input: an honest answer that
        # returns a list where the solution returns a tuple (a cache passed back in) replays
        h.update(f"seq{len(x)}".encode())
        for i in x:
            _digest_into(h, i, depth + 1)
    elif isinstance(x, dict):
        h.update(f"d{len(x)}".encode())
        for k in sorted(x, key=repr):
            h.update(repr(k).encode())
            _digest_into(h, x[k], depth + 1)
    elif isinstance(x, (int, float, complex, str, bool, type(None))):
        h.update(repr(x).encode())
    else:
        h.update(type(x).__name__.encode())


def digest(args, kwargs) -> str:
    """A fingerprint of a call's inputs (values, dtypes and shapes; lists and tuples alike)."""
    h = hashlib.sha256()
    _digest_into(h, (args, kwargs))
    return h.hexdigest()


def _is_tensor(x) -> bool:
    return (type(x).__module__ or "").startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def array_leaves(args, kwargs, limit: int = 64) -> list:
    """(path, array or tensor) for the arrays a call received, in its arguments and one level of
    lists, tuples and dicts inside them: what a function could change in place."""
    out = []

    def visit(x, path, depth):
        if len(out) >= limit:
            return
        if isinstance(x, np.ndarray) or _is_tensor(x):
            out.append((path, x))
        elif depth < 2 and isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                visit(v, path + [i], depth + 1)
        elif depth < 2 and isinstance(x, dict):
            for k, v in x.items():
                if isinstance(k, (str, int)) and not isinstance(k, bool):
                    visit(v, path + [k], depth + 1)

    for i, a in enumerate(args):
        visit(a, ["a", i], 0)
    for k, v in kwargs.items():
        visit(v, ["k", k], 0)
    return out


def snapshot(leaves: list) -> list:
    """Copies of the leaves' contents (to compare with after the call)."""
    return [np.array(_as_numpy(x), copy=True) for _, x in leaves]


def _as_numpy(x):
    if _is_tensor(x):
        t = x.detach().cpu()
        return t.float().numpy() if "bfloat16" in str(t.dtype) else t.numpy()
    return np.asarray(x)


def changed_leaves(leaves: list, before: list) -> list:
    """[path, encoded new contents] for each leaf whose contents changed during the call."""
    out = []
    for (path, x), old in zip(leaves, before):
        now = _as_numpy(x)
        if now.shape != old.shape or now.dtype != old.dtype or not np.array_equal(now, old, equal_nan=True):
            out.append([path, encode(np.array(now, copy=True))])
    return out


def apply_changes(args, kwargs, changes) -> None:
    """Write a sandboxed call's in-place changes (decoded) into the judge's own arguments, so
    that a test which checks its inputs after the call sees what the student's function did."""
    for path, new in changes:
        if not isinstance(path, list) or len(path) < 2 or not isinstance(new, np.ndarray):
            raise Undecodable("bad in-place change")
        try:
            x = args[path[1]] if path[0] == "a" else kwargs[path[1]]
            for key in path[2:]:
                x = x[key]
        except (KeyError, IndexError, TypeError):
            raise Undecodable("bad in-place change") from None
        if _is_tensor(x):
            import torch

            with torch.no_grad():
                if tuple(x.shape) == new.shape:
                    x.copy_(torch.from_numpy(np.array(new, copy=True)).to(x.dtype))
                else:
                    x.data = torch.from_numpy(np.array(new, copy=True)).to(x.dtype)
        elif isinstance(x, np.ndarray) and x.shape == new.shape and x.flags.writeable:
            x[...] = new
        else:
            raise Undecodable("an input changed its shape or type in place")
