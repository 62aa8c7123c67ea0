"""Call a Python function from compiled code, for warnings raised inside a jitted step.

``jax.pure_callback`` marks its program as holding a host callback, and JAX then runs every
call of the program, taken branch or not, without its C++ dispatch fast path and with runtime
tokens threaded through its inputs, a fixed cost per SVI step that is a large share of a
small model's step, and such programs never enter JAX's persistent compilation cache.

On CPU :func:`host_call` instead emits an XLA FFI custom call to one handler of this module,
a ``ctypes`` function registered under :data:`TARGET` (typed FFI, ``XLA_FFI_Handler``): it
reads its operands from host memory and calls the registered Python function, holding the
GIL as ctypes does. The compiled program then holds no host callback, so a step whose call
sits in an untaken ``lax.cond`` branch costs what the same step without it costs. An
exception in the function (e.g. a warning turned into an error by a ``warnings`` filter) is
returned to XLA as an FFI error, so it fails the step as it would under ``pure_callback``.

The handler reads the C structs of ``xla/ffi/api/c_api.h`` (FFI API major version 0). The
FFI path is used only when the jaxlib's header says so and a probe call at first use returns
the values it was given with the struct sizes this module lays out, and only in programs on
one device (a partitioned program would run a custom call on every device; JAX runs a
callback once). Otherwise, and on every other platform (device memory), the call lowers
to ``jax.pure_callback``.
"""

import ctypes
import pathlib
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

#: the FFI target's name
TARGET = "numpyro_dais_host_call"

_size_t, _ptr = ctypes.c_size_t, ctypes.c_void_p
_METADATA_EXTENSION, _EXECUTE, _ERROR_UNKNOWN = 1, 3, 2


class _Extension(ctypes.Structure):
    pass


_Extension._fields_ = [
    ("struct_size", _size_t),
    ("type", ctypes.c_int),
    ("next", ctypes.POINTER(_Extension)),
]


class _ApiVersion(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", _size_t), ("api_version", _ApiVersion), ("traits", ctypes.c_uint32)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("extension_base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


class _Values(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets share this layout
    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("size", ctypes.c_int64),
        ("types", _ptr),
        ("values", ctypes.POINTER(_ptr)),
    ]


class _Attrs(_Values):  # XLA_FFI_Attrs: that layout (``values`` are its names) + attrs
    _fields_ = [("attrs", _ptr)]


class _CallFrame(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", ctypes.POINTER(_Extension)),
        ("api", _ptr),
        ("ctx", _ptr),
        ("stage", ctypes.c_int),
        ("args", _Values),
        ("rets", _Values),
        ("attrs", _Attrs),
    ]


class _Buffer(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("dtype", ctypes.c_int),
        ("data", _ptr),
        ("rank", ctypes.c_int64),
        ("dims", ctypes.POINTER(ctypes.c_int64)),
    ]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", _size_t),
        ("extension_start", _ptr),
        ("message", ctypes.c_char_p),
        ("errc", ctypes.c_int),
    ]


_ERROR_CREATE = ctypes.CFUNCTYPE(_ptr, ctypes.POINTER(_ErrorCreateArgs))
#: byte offset of ``XLA_FFI_Error_Create`` in ``XLA_FFI_Api``: struct_size, extension_start,
#: api_version (an ``XLA_FFI_Api_Version``), internal_api
_ERROR_CREATE_OFFSET = 2 * 8 + ctypes.sizeof(_ApiVersion) + 8

#: the smallest ``struct_size`` each struct must report for the fields read here
_SIZES = {
    "frame": _CallFrame.attrs.offset + ctypes.sizeof(_Attrs),
    "values": ctypes.sizeof(_Values),
    "buffer": ctypes.sizeof(_Buffer),
}

_functions: dict[int, object] = {}  # id -> Python function
_seen_sizes: dict[str, int] = {}  # struct sizes of the last call, for the probe


def _api_version():
    """``(major, minor)`` of the FFI API from the jaxlib's own header, or ``None``."""
    try:
        header = pathlib.Path(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h").read_text()
        return tuple(
            int(re.search(rf"#define XLA_FFI_API_{part} (\d+)", header).group(1))
            for part in ("MAJOR", "MINOR")
        )
    except (OSError, AttributeError):
        return None


def _error(frame, exc):
    create = _ERROR_CREATE(ctypes.cast(frame.api + _ERROR_CREATE_OFFSET, ctypes.POINTER(_ptr))[0])
    message = f"{type(exc).__name__}: {exc}".encode()
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message, _ERROR_UNKNOWN)
    return create(ctypes.byref(args))


@ctypes.CFUNCTYPE(_ptr, ctypes.POINTER(_CallFrame))
def _handler(frame_ptr):
    """``XLA_FFI_Handler``: operands ``(id: int32[], values: float32[n])``, result
    ``float32[] = 0``; calls ``_functions[id](*values)``."""
    frame = frame_ptr.contents
    extension = frame.extension_start
    while extension:  # registration asks for the handler's metadata
        if extension.contents.type == _METADATA_EXTENSION:
            metadata = ctypes.cast(extension, ctypes.POINTER(_MetadataExtension))
            version = metadata.contents.metadata.contents
            version.api_version.major_version, version.api_version.minor_version = _VERSION
            version.traits = 0
            return None
        extension = extension.contents.next
    if frame.stage != _EXECUTE:
        return None
    fid_buffer, values_buffer, result = (
        ctypes.cast(p, ctypes.POINTER(_Buffer)).contents
        for p in (frame.args.values[0], frame.args.values[1], frame.rets.values[0])
    )
    _seen_sizes.update(
        frame=frame.struct_size, values=frame.args.struct_size, buffer=values_buffer.struct_size
    )
    ctypes.cast(result.data, ctypes.POINTER(ctypes.c_float))[0] = 0.0
    fid = ctypes.cast(fid_buffer.data, ctypes.POINTER(ctypes.c_int32))[0]
    n = values_buffer.dims[0]
    values = np.ctypeslib.as_array(
        ctypes.cast(values_buffer.data, ctypes.POINTER(ctypes.c_float)), (n,)
    )
    try:
        _functions[fid](*values.copy())
    except BaseException as exc:  # noqa: BLE001 - handed to XLA, raised by the step
        return _error(frame, exc)
    return None


_VERSION = _api_version()
_ids: dict[str, int] = {}  # content key -> id
_ffi_ok: list[bool] = []  # [] until probed, then [True] or [False]


def _key(fn) -> str:
    """``fn`` by content where it is a ``functools.partial`` of plain values (the same key in
    every process), else by identity (a partial of mutable state is its own function)."""
    if not hasattr(fn, "func"):
        return f"@{id(fn)}"
    plain = (str, int, float, bool, type(None))
    args = [a if isinstance(a, plain) else f"@{id(a)}" for a in fn.args]
    kwargs = {k: v if isinstance(v, plain) else f"@{id(v)}" for k, v in fn.keywords.items()}
    return repr((fn.func.__module__, fn.func.__qualname__, args, sorted(kwargs.items())))


def _register(fn) -> int:
    """The id of ``fn``, a hash of :func:`_key` (a collision takes the next free id). A
    program calls the function its own process registered under the id in its HLO, also
    when JAX's persistent cache supplies it; content keys only make such hits more likely."""
    key = _key(fn)
    if key not in _ids:
        fid = zlib.crc32(key.encode()) & 0x7FFFFFFF
        while fid in _functions:
            fid = (fid + 1) & 0x7FFFFFFF
        _ids[key] = fid
    _functions[_ids[key]] = fn
    return _ids[key]


def _ffi_call(fid, values):
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((), jnp.float32))
    return call(jnp.asarray(fid, jnp.int32), values)


def _probe() -> bool:
    """Register the handler and check one call on the CPU: the values arrive, the result is
    0 and XLA's structs are at least as large as the ones laid out here."""
    if _VERSION is None or _VERSION[0] != 0:
        return False
    seen = []
    try:
        cpu = jax.local_devices(backend="cpu")[0]  # this process's, not process 0's
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_handler), platform="cpu")
        fid = _register(lambda *v: seen.append(v))
        values = np.array([1.5, -2.0], np.float32)
        with jax.default_device(cpu), jax.ensure_compile_time_eval():  # run now, even in a trace
            out = jax.jit(_ffi_call, static_argnums=0)(fid, values)
        ok = float(out) == 0.0 and seen == [(1.5, -2.0)]
        return ok and all(_seen_sizes.get(k, 0) >= size for k, size in _SIZES.items())
    except Exception:  # noqa: BLE001 - any failure: use pure_callback
        return False


def _pure_callback(values, fn):
    def host(v):
        fn(*v)
        return np.zeros((), np.float32)

    return jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), values)


def _impl(values, *, fn, fid):
    fn(*np.asarray(values))
    return jnp.zeros((), jnp.float32)


def _cpu_lowering(ctx, values, *, fn, fid):
    """The FFI call in a program on one device; ``pure_callback`` in a partitioned one,
    which JAX runs once (on the first device) where a custom call would run on each."""
    if fid is not None and getattr(ctx.module_context.axis_context, "num_devices", 0) == 1:
        return mlir.lower_fun(lambda v: _ffi_call(fid, v), multiple_results=False)(ctx, values)
    return _default_lowering(ctx, values, fn=fn, fid=fid)


def _default_lowering(ctx, values, *, fn, fid):
    return mlir.lower_fun(lambda v: _pure_callback(v, fn), multiple_results=False)(ctx, values)


def _jvp(primals, tangents, *, fn, fid):
    return _host_call_p.bind(*primals, fn=fn, fid=fid), jnp.zeros((), jnp.float32)


_host_call_p = Primitive("numpyro_dais_host_call")
_host_call_p.def_impl(_impl)
_host_call_p.def_abstract_eval(lambda values, *, fn, fid: jax.core.ShapedArray((), jnp.float32))
ad.primitive_jvps[_host_call_p] = _jvp
mlir.register_lowering(_host_call_p, _default_lowering)
mlir.register_lowering(_host_call_p, _cpu_lowering, platform="cpu")


def host_call(fn, values) -> jax.Array:
    """Call ``fn(*values)`` on the host from compiled code; ``values`` are scalars, passed
    as float32. Returns a float32 ``0.0`` that the caller must use (XLA drops a call whose
    result is unused). Meant for a branch that is rarely taken (inside ``lax.cond``)."""
    values = jnp.stack([jnp.asarray(v, jnp.float32) for v in values])
    if not _ffi_ok:
        _ffi_ok.append(_probe())
    fid = _register(fn) if _ffi_ok[0] else None
    return _host_call_p.bind(jax.lax.stop_gradient(values), fn=fn, fid=fid)
