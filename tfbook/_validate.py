"""Shape and argument checks shared by :mod:`tfbook.numpy` and :mod:`tfbook.torch`.

The checks only look at ``.shape``, ``.ndim`` and ``.dtype``, so one implementation
serves NumPy arrays and torch tensors. Every failure raises ``ValueError`` whose
message names the argument and shows the shapes involved, e.g.::

    Q has D_K=64 but K has D_K=32 (Q: (2, 5, 64), K: (2, 7, 32))
"""

from __future__ import annotations

__all__ = [
    "shape_of",
    "broadcast_batch",
    "check_ndim",
    "check_axis",
    "check_last_dim",
    "check_floating",
    "check_qkv",
    "check_x_q_x_kv",
    "check_mask",
    "check_positive_int",
    "check_choice",
    "check_vector",
    "check_matrix",
    "check_params",
    "check_heads",
]


def shape_of(x) -> tuple:
    """The shape of an array or tensor as a plain tuple of ints."""
    return tuple(int(s) for s in x.shape)


def _broadcast(a: tuple, b: tuple):
    """Broadcast two shapes by NumPy's rules; ``None`` when they are incompatible."""
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def broadcast_batch(named_shapes: dict) -> tuple:
    """Broadcast the leading ("batch") shapes given as ``{name: batch_shape}``.

    Raises ``ValueError`` naming every argument when they do not broadcast.
    """
    out: tuple = ()
    for shp in named_shapes.values():
        out = _broadcast(out, shp)
        if out is None:
            desc = ", ".join(f"{k}: {v}" for k, v in named_shapes.items())
            raise ValueError(f"batch axes do not broadcast ({desc})")
    return out


def check_ndim(name: str, x, min_ndim: int, max_ndim: int | None = None, what: str = "") -> None:
    """``x.ndim`` must lie in ``[min_ndim, max_ndim]``."""
    if not hasattr(x, "shape") or not hasattr(x, "ndim"):
        raise ValueError(f"{name} must be an array or tensor, got {type(x).__name__}")
    nd = x.ndim
    hi = max_ndim if max_ndim is not None else nd
    if nd < min_ndim or nd > hi:
        if max_ndim is None:
            want = f"at least {min_ndim} axes"
        elif max_ndim == min_ndim:
            want = f"exactly {min_ndim} axes"
        else:
            want = f"{min_ndim} to {max_ndim} axes"
        hint = f" {what}" if what else ""
        raise ValueError(f"{name} must have {want}{hint}, got shape {shape_of(x)}")


def check_axis(name: str, x, axis: int) -> None:
    """``x`` has at least one axis and ``axis`` names one of them (negative counts from the end)."""
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least 1 axis, got shape {shape_of(x)}")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for {name} of shape {shape_of(x)}")


def check_last_dim(name: str, x, size: int, label: str, other: str = "", other_shape=None) -> None:
    """``x.shape[-1]`` must equal ``size`` (``label`` names the dimension, e.g. ``D``)."""
    if x.shape[-1] != size:
        extra = f", {other}: {tuple(other_shape)}" if other else ""
        raise ValueError(
            f"{name} has last axis {int(x.shape[-1])} but {label}={size} is required "
            f"({name}: {shape_of(x)}{extra})"
        )


def check_floating(name: str, x) -> None:
    """``x`` must have a floating-point dtype."""
    kind = getattr(x.dtype, "kind", None)
    if kind is not None:  # NumPy
        ok = kind == "f"
    else:  # torch
        ok = bool(getattr(x.dtype, "is_floating_point", False))
    if not ok:
        raise ValueError(f"{name} must be floating point, got dtype {x.dtype} (shape {shape_of(x)})")


def check_qkv(Q, K, V) -> tuple:
    """Check ``Q (..., T_q, D_K)``, ``K (..., T_k, D_K)``, ``V (..., T_k, D_V)``.

    Returns the broadcast batch shape.
    """
    for name, x in (("Q", Q), ("K", K), ("V", V)):
        check_ndim(name, x, 2, what="(..., T, D)")
    sq, sk, sv = shape_of(Q), shape_of(K), shape_of(V)
    if sq[-1] != sk[-1]:
        raise ValueError(f"Q has D_K={sq[-1]} but K has D_K={sk[-1]} (Q: {sq}, K: {sk})")
    if sk[-2] != sv[-2]:
        raise ValueError(f"K has T_k={sk[-2]} but V has T_k={sv[-2]} (K: {sk}, V: {sv})")
    if sk[-2] == 0:
        raise ValueError(f"K has T_k=0: attention needs at least one key (K: {sk}, V: {sv})")
    if sq[-1] == 0:
        raise ValueError(f"Q and K have D_K=0: the scores need a width of at least 1 (Q: {sq}, K: {sk})")
    return broadcast_batch({"Q": sq[:-2], "K": sk[:-2], "V": sv[:-2]})


def check_x_q_x_kv(X_q, X_kv) -> int:
    """Queries' sequence ``X_q (..., T_q, D)`` and keys'/values' ``X_kv (..., T_kv, D)``: same ``D``, returned."""
    check_ndim("X_q", X_q, 2, what="(..., T_q, D)")
    check_ndim("X_kv", X_kv, 2, what="(..., T_kv, D)")
    D = X_q.shape[-1]
    if X_kv.shape[-1] != D:
        raise ValueError(f"X_q has D={D} but X_kv has D={X_kv.shape[-1]} "
                         f"(X_q: {shape_of(X_q)}, X_kv: {shape_of(X_kv)})")
    return D


def check_mask(mask, T_q: int, T_k: int, batch: tuple, name: str = "mask") -> None:
    """A boolean mask broadcastable to ``batch + (T_q, T_k)``."""
    if mask is None:
        return
    if not hasattr(mask, "shape"):
        raise ValueError(f"{name} must be a boolean array or tensor, got {type(mask).__name__}")
    dt = mask.dtype
    is_bool = getattr(dt, "kind", None) == "b" or str(dt) == "torch.bool"
    if not is_bool:
        raise ValueError(
            f"{name} must be boolean (True = may attend), got dtype {dt} (shape {shape_of(mask)})"
        )
    target = tuple(batch) + (T_q, T_k)
    ms = shape_of(mask)
    if len(ms) > len(target) or _broadcast(ms, target) != target:
        raise ValueError(
            f"{name} of shape {ms} does not broadcast to (..., T_q, T_k) = {target}"
        )


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """``value`` must be an int (not bool) ``>= minimum``."""
    try:
        import operator

        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(v)


def check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def check_vector(name: str, x, size: int, label: str) -> None:
    """``x`` must be a 1-D array of length ``size``."""
    check_ndim(name, x, 1, 1, what=f"({label},)")
    if x.shape[0] != size:
        raise ValueError(f"{name} must have shape ({label},) = ({size},), got {shape_of(x)}")


def check_matrix(name: str, x, rows: int | None, cols: int | None, labels: str) -> None:
    """``x`` must be 2-D with the given sizes (``None`` = any); ``labels`` like ``"(D, D_K)"``."""
    check_ndim(name, x, 2, 2, what=labels)
    r, c = shape_of(x)
    if (rows is not None and r != rows) or (cols is not None and c != cols):
        want = (rows if rows is not None else "?", cols if cols is not None else "?")
        raise ValueError(f"{name} must have shape {labels} = ({want[0]}, {want[1]}), got {(r, c)}")


def check_params(name: str, params, required) -> None:
    """``params`` must be a dict holding every key in ``required``."""
    if not isinstance(params, dict):
        raise ValueError(f"{name} must be a dict, got {type(params).__name__}")
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"{name} is missing keys {missing} (has {sorted(params)})")


def check_heads(D: int, num_heads, X_shape: tuple, name: str = "X_q") -> int:
    """``num_heads`` must be a positive int dividing ``D``."""
    H = check_positive_int("num_heads", num_heads)
    if D % H != 0:
        raise ValueError(f"num_heads={H} does not divide D={D} ({name}: {tuple(X_shape)})")
    return H
