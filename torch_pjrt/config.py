"""One configuration object; every field can come from a ``TORCH_PJRT_*`` variable.

``settings`` holds the values in effect. Each field has a process default (from the
environment at import, or set with ``settings.<field> = value``, which every thread
sees) and may be overridden for a block with ``with torch_pjrt.config(...)``. Such an
override lives in a :class:`contextvars.ContextVar`: it holds for the thread (or asyncio
task) that entered the block, so two threads can run with different settings at once.

Every value is checked where it is set: an unknown mode, a typo in ``fallback`` or a
size below 1 raise a ``ValueError`` naming what is allowed, and a bad ``TORCH_PJRT_*``
variable raises at ``import torch_pjrt``, naming the variable.

NOTE: this is the only module that reads ``TORCH_PJRT_*`` variables
(tests/test_config.py checks it): a new setting gets a field here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
import os

__all__ = ["FALLBACKS", "MODES", "Config", "config", "op_path", "settings"]

MODES = ("debug", "eager", "fused")
FALLBACKS = ("cpu", "error")
ATTENTION = ("auto", "kernel", "xla")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


# --- kinds of values: what each field accepts --------------------------------------------


class _Kind:
    """What a field accepts: ``check`` normalizes a value from code, ``parse`` a string
    from the environment; both raise ValueError (its text is not shown: the caller
    says ``<field> must be <expected>``)."""

    expected = ""

    def check(self, value):
        raise NotImplementedError

    def parse(self, raw: str):
        return self.check(raw)

    @property
    def env_expected(self) -> str:
        return self.expected


class _Choice(_Kind):
    def __init__(self, allowed: tuple):
        self.allowed = allowed
        self.expected = f"one of {', '.join(allowed)}"

    def check(self, value):
        if isinstance(value, str) and value.strip().lower() in self.allowed:
            return value.strip().lower()
        raise ValueError


class _Int(_Kind):
    def __init__(self, minimum: int, optional: bool = False):
        self.minimum, self.optional = minimum, optional
        self.expected = f"a whole number >= {minimum}" + (", or None" if optional else "")

    def check(self, value):
        if value is None and self.optional:
            return None
        # NOTE: bool is an Integral; fused_max_ops=True is a mistake, not 1
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            if value >= self.minimum:
                return int(value)
        raise ValueError

    def parse(self, raw: str):
        return self.check(int(raw.strip()))

    @property
    def env_expected(self) -> str:
        return f"a whole number >= {self.minimum}"


class _Seconds(_Kind):
    def __init__(self, positive: bool, optional: bool = False):
        self.positive, self.optional = positive, optional
        self.expected = "a number of seconds" + (" > 0" if positive else " >= 0")
        if optional:
            self.expected += ", or None"

    def check(self, value):
        if value is None and self.optional:
            return None
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            value = float(value)
            if value > 0 or (value == 0 and not self.positive):
                return value
        raise ValueError

    def parse(self, raw: str):
        return self.check(float(raw.strip()))

    @property
    def env_expected(self) -> str:
        return "a number of seconds" + (" > 0" if self.positive else " >= 0")


class _Bool(_Kind):
    expected = "True or False"

    def check(self, value):
        # NOTE: 0 and 1 are accepted as well: config(check_nan=1) is a common spelling
        if isinstance(value, bool) or (isinstance(value, int) and value in (0, 1)):
            return bool(value)
        raise ValueError

    def parse(self, raw: str):
        word = raw.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ValueError

    @property
    def env_expected(self) -> str:
        return f"one of {', '.join(_TRUE)} (on) or {', '.join(_FALSE)} (off)"


class _Text(_Kind):
    expected = "a non-empty string, or None"

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, str) and value.strip():
            return value.strip()
        raise ValueError


class _Path(_Kind):
    expected = "a path (str or os.PathLike), or None"

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, (str, os.PathLike)) and os.fspath(value):
            return os.fspath(value)
        raise ValueError


class _Buckets(_Kind):
    expected = "'pow2', None, or sizes >= 1 such as (16, 32, 64)"

    def check(self, value):
        if value is None:
            return None
        if isinstance(value, str):  # "pow2", or a spec as in the environment
            return self.parse(value)
        try:
            sizes = tuple(sorted(_Int(1).check(s) for s in value))
        except TypeError:  # not iterable
            raise ValueError from None
        if not sizes:
            raise ValueError
        return sizes

    def parse(self, raw: str):
        spec = raw.strip().lower()
        if spec in ("", "0", "off", "none", "false", "no"):
            return None
        if spec == "pow2":
            return "pow2"
        return self.check([int(x) for x in spec.split(",") if x.strip()])

    @property
    def env_expected(self) -> str:
        return "'pow2', '0' (no padding) or sizes like '16,32,64'"


def _field(default, env, kind: _Kind, *, live: bool = False, read=None):
    """A Config field: its default, its variable(s) (the first one set wins), what it
    accepts, and whether it is read from the environment at each use (``live``: the
    launcher's variables, which a launcher may set after ``import torch_pjrt``).
    ``read`` replaces the plain reading of the variable (for cache_dir)."""
    envs = (env,) if isinstance(env, str) else tuple(env)
    meta = {"env": envs, "kind": kind, "live": live, "read": read}
    return dataclasses.field(default=default, metadata=meta)


def _read_cache_dir(environ) -> str | None:
    """``TORCH_PJRT_CACHE=0`` turns the cache off; else ``TORCH_PJRT_CACHE_DIR``, else the
    user's cache folder."""
    if not _from_environ("TORCH_PJRT_CACHE", _Bool(), True, environ):
        return None
    explicit = _from_environ("TORCH_PJRT_CACHE_DIR", _Path(), None, environ)
    if explicit:
        return explicit
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "torch_pjrt", "xla")


# --- the fields --------------------------------------------------------------------------


@dataclasses.dataclass
class Config:
    """Settings of torch_pjrt: the fields of ``torch_pjrt.settings`` and
    ``torch_pjrt.config(...)``. Every field is checked when it is set (a ValueError says
    what is allowed); its variable is read at ``import torch_pjrt`` unless said otherwise.
    docs/config.md lists them all.

    Attributes:
        fallback: what an op without a lowering does: ``"cpu"`` runs it on the CPU
            with a one-time warning per op, ``"error"`` raises (``TORCH_PJRT_FALLBACK``).
        cpu_devices: number of devices on JAX's CPU platform, or None for JAX's
            default (``TORCH_PJRT_CPU_DEVICES``); used when the runtime starts.
        platform: the PJRT platform to use, or None for the best one found
            (``PJRT_DEVICE``, then ``TORCH_PJRT_PLATFORM``); used when the runtime starts.
        cache_dir: the persistent XLA compilation cache, shared by processes, or None
            for none (``TORCH_PJRT_CACHE_DIR``; default ``$XDG_CACHE_HOME/torch_pjrt/xla``,
            else ``~/.cache/torch_pjrt/xla``; ``TORCH_PJRT_CACHE=0`` turns it off). Used
            when the runtime starts.
        cache_min_seconds: programs that compile faster than this are not written to
            the persistent cache (``TORCH_PJRT_CACHE_MIN_SECONDS``, default 0.2).
        buckets: how compiled graphs with dynamic sizes pad them: ``"pow2"`` (the next
            power of two), a sorted tuple of sizes, or None for no padding (one program
            per size). ``TORCH_PJRT_BUCKETS``: ``pow2``, ``16,32,64,128`` or ``0``.
        mode: the execution mode, ``"debug"``, ``"eager"`` or ``"fused"`` (the default;
            ``TORCH_PJRT_MODE``; see :mod:`torch_pjrt.modes` and docs/modes.md).
        fused_max_ops: in fused mode, the recording runs as a program once it holds
            this many ops (``TORCH_PJRT_FUSED_MAX_OPS``, default 5000; at least 1).
        checks: check values on the device as CPU PyTorch does (indices in range, class
            targets, divisors), reported at the next host sync
            (``TORCH_PJRT_CHECKS``, default on; see :mod:`torch_pjrt.runtime.asserts`).
            Off, programs compute no checks (peak speed). Read when a program is built:
            eager ops follow a change at once, compiled graphs when they compile.
        check_nan: raise at the first op whose result has a NaN or an infinity
            (``TORCH_PJRT_CHECK_NAN``); ops then run one at a time, synchronously.
        check_numerics: run every op on the CPU too and warn at the first op whose
            result differs beyond tolerance (``TORCH_PJRT_CHECK_NUMERICS``); ops then run
            one at a time, synchronously.
        strict: raise on CPU fallbacks, and on host syncs and compilations inside a
            ``torch_pjrt.step()`` after warm-up (``TORCH_PJRT_STRICT``).
        strict_warmup: steps that may compile and sync in strict mode
            (``TORCH_PJRT_STRICT_WARMUP``, default 2; at least 0).
        dump_graphs: a folder where every graph ``torch.compile(backend="pjrt")``
            compiles is written (FX and StableHLO), or None (``TORCH_PJRT_DUMP_GRAPHS``;
            :func:`torch_pjrt.compile.dump_graphs` sets it too).
        distributed: under ``torchrun`` with several processes, start JAX's
            multi-controller runtime (``TORCH_PJRT_DISTRIBUTED``, default on; see
            :mod:`torch_pjrt.runtime.launch`). Read when the runtime starts.
        coordinator_port: the port of JAX's coordinator, or None for ``MASTER_PORT + 1``
            (``TORCH_PJRT_COORDINATOR_PORT``). Read when the runtime starts.
        init_timeout: seconds ``jax.distributed.initialize`` waits for every process to
            join, or None for JAX's default of 300 (``TORCH_PJRT_INIT_TIMEOUT``).
        heartbeat_timeout: seconds JAX's coordination service waits for a silent
            process before it ends every process, or None for JAX's default of 100
            (``TORCH_PJRT_HEARTBEAT_TIMEOUT``).
        distributed_checks: before each pjrt collective the ranks agree on it, so a
            failing rank never leaves the others hung (``TORCH_PJRT_DISTRIBUTED_CHECKS``,
            default on; see :mod:`torch_pjrt.distributed.faults`). Read when a process
            group is created.
        collective_timeout: seconds a rank waits for the others before a collective, or
            None for the process group's timeout (``TORCH_PJRT_COLLECTIVE_TIMEOUT``).

        attention: the path of ``F.scaled_dot_product_attention`` on pjrt tensors:
            ``"auto"`` (the flash kernel on accelerators for long sequences, XLA on the
            CPU), ``"kernel"`` or ``"xla"`` (``TORCH_PJRT_ATTENTION``; see
            :mod:`torch_pjrt.kernels.attention` and docs/kernels.md), and of the vLLM
            backend's attention over its paged cache (``auto``: the kernel library's
            ``paged_attention_kv`` on GPU; docs/serving.md). Read at each call.

    The six before ``attention`` are the launcher's: their variables are read each time
    they are used (unless code set the field), as a launcher may set them after
    ``import torch_pjrt``.
    """

    fallback: str = _field("cpu", "TORCH_PJRT_FALLBACK", _Choice(FALLBACKS))
    cpu_devices: int | None = _field(None, "TORCH_PJRT_CPU_DEVICES", _Int(1, optional=True))
    platform: str | None = _field(None, ("PJRT_DEVICE", "TORCH_PJRT_PLATFORM"), _Text())
    cache_dir: str | None = _field(None, "TORCH_PJRT_CACHE_DIR", _Path(), read=_read_cache_dir)
    cache_min_seconds: float = _field(0.2, "TORCH_PJRT_CACHE_MIN_SECONDS", _Seconds(False))
    buckets: object = _field("pow2", "TORCH_PJRT_BUCKETS", _Buckets())
    mode: str = _field("fused", "TORCH_PJRT_MODE", _Choice(MODES))
    fused_max_ops: int = _field(5000, "TORCH_PJRT_FUSED_MAX_OPS", _Int(1))
    checks: bool = _field(True, "TORCH_PJRT_CHECKS", _Bool())
    check_nan: bool = _field(False, "TORCH_PJRT_CHECK_NAN", _Bool())
    check_numerics: bool = _field(False, "TORCH_PJRT_CHECK_NUMERICS", _Bool())
    strict: bool = _field(False, "TORCH_PJRT_STRICT", _Bool())
    strict_warmup: int = _field(2, "TORCH_PJRT_STRICT_WARMUP", _Int(0))
    dump_graphs: str | None = _field(None, "TORCH_PJRT_DUMP_GRAPHS", _Path())
    distributed: bool = _field(True, "TORCH_PJRT_DISTRIBUTED", _Bool(), live=True)
    coordinator_port: int | None = _field(
        None, "TORCH_PJRT_COORDINATOR_PORT", _Int(1, optional=True), live=True
    )
    init_timeout: float | None = _field(
        None, "TORCH_PJRT_INIT_TIMEOUT", _Seconds(True, optional=True), live=True
    )
    heartbeat_timeout: float | None = _field(
        None, "TORCH_PJRT_HEARTBEAT_TIMEOUT", _Seconds(True, optional=True), live=True
    )
    distributed_checks: bool = _field(True, "TORCH_PJRT_DISTRIBUTED_CHECKS", _Bool(), live=True)
    collective_timeout: float | None = _field(
        None, "TORCH_PJRT_COLLECTIVE_TIMEOUT", _Seconds(True, optional=True), live=True
    )
    attention: str = _field("auto", "TORCH_PJRT_ATTENTION", _Choice(ATTENTION))

    def __setattr__(self, name: str, value) -> None:
        # every write, the dataclass __init__'s included, goes through the check
        object.__setattr__(self, name, _check(name, value))

    @classmethod
    def from_env(cls, environ=None) -> Config:
        """The settings the ``TORCH_PJRT_*`` variables of ``environ`` (default:
        ``os.environ``) give; a bad value raises ValueError naming the variable."""
        environ = os.environ if environ is None else environ
        return cls(**{name: _env_value(name, environ) for name in _FIELDS})


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_LIVE = frozenset(name for name, f in _FIELDS.items() if f.metadata["live"])


def _unknown(name: str) -> AttributeError:
    return AttributeError(
        f"torch_pjrt has no setting {name!r}; the settings are: {', '.join(_FIELDS)}"
    )


def _check(name: str, value):
    """``value`` checked (and normalized) for the field ``name``."""
    f = _FIELDS.get(name)
    if f is None:
        raise _unknown(name)
    kind = f.metadata["kind"]
    try:
        return kind.check(value)
    except ValueError:
        pass
    raise ValueError(f"torch_pjrt {name} must be {kind.expected}, but got {value!r}")


def _from_environ(var: str, kind: _Kind, default, environ):
    raw = environ.get(var)
    if raw is None or not raw.strip():  # an empty variable is an unset one
        return default
    try:
        return kind.parse(raw)
    except ValueError:
        pass
    raise ValueError(
        f"{var} must be {kind.env_expected}, but got {raw!r}. Fix the variable, or unset it "
        "to use the default."
    )


def _env_value(name: str, environ):
    """Field ``name`` as its variable(s) in ``environ`` give it (else its default)."""
    f = _FIELDS[name]
    read = f.metadata["read"]
    if read is not None:
        return read(environ)
    for var in f.metadata["env"]:
        value = _from_environ(var, f.metadata["kind"], None, environ)
        if value is not None:
            return value
    return f.default


def _buckets(spec: str):
    """A ``TORCH_PJRT_BUCKETS`` string as the ``buckets`` value."""
    return _from_environ("TORCH_PJRT_BUCKETS", _Buckets(), None, {"TORCH_PJRT_BUCKETS": spec})


# --- the settings in effect --------------------------------------------------------------

# The process defaults: a plain object, so that reading one is one dictionary lookup.
_defaults = Config.from_env()
_values = _defaults.__dict__
# Live fields that code set: those are no longer read from the environment.
_pinned: set = set()
# None, or the overrides of the enclosing ``config(...)`` blocks of this context, merged.
# NOTE: a dict stored here is never changed (a copy of the context, in another task,
# may share it); a nested block stores a new one.
_scoped: contextvars.ContextVar = contextvars.ContextVar("torch_pjrt_config", default=None)
# Called as listener(old, new) before the execution mode changes for this thread (a
# config(mode=...) block) or for the process (settings.mode = ...): torch_pjrt.modes
# registers the run of what fused mode recorded (layers point down: config knows no
# modes).
_mode_listeners: list = []


def _mode_switch(old: str, new: str) -> None:
    if old != new:
        for listener in _mode_listeners:
            listener(old, new)


# NOTE: while a graph is captured (torch.pjrt.graph), every op of every thread is
# recorded, whatever mode a thread is in: the count of captures under way, read by the
# mode's getter and by op_path (set by torch_pjrt.modes.capture through recording()).
_recording = [0]


def recording(on: bool) -> None:
    """Make every op of every thread be recorded (``on``), or stop doing so: a graph
    capture is under way. The mode then reads ``"fused"`` and per-op checks are off."""
    _recording[0] += 1 if on else -1


def _setting(name: str) -> property:
    """The property of ``settings`` for field ``name``: the scoped override of this
    context if there is one, else the process default."""
    live = name in _LIVE

    # NOTE: on the per-op hot path (mode, check_nan, check_numerics, strict): keep it to
    # one ContextVar read and one dict lookup, about 50 ns.
    def get(self, _get=_scoped.get, _values=_values):
        scoped = _get()
        if scoped is not None and name in scoped:
            return scoped[name]
        return _values[name]

    def get_mode(self, _get=_scoped.get, _values=_values, _recording=_recording):
        if _recording[0]:
            return "fused"
        scoped = _get()
        if scoped is not None and name in scoped:
            return scoped[name]
        return _values[name]

    def get_live(self, _get=_scoped.get, _values=_values):
        scoped = _get()
        if scoped is not None and name in scoped:
            return scoped[name]
        if name in _pinned:
            return _values[name]
        return _env_value(name, os.environ)

    def set(self, value):  # the process default, for every thread
        value = _check(name, value)
        if name == "mode":
            _mode_switch(_values["mode"], value)
        _values[name] = value
        if live:
            _pinned.add(name)

    getter = get_live if live else get_mode if name == "mode" else get
    return property(getter, set, doc=f"The ``{name}`` setting in effect.")


class _Settings:
    """The settings in effect: ``settings.mode`` reads the mode of this thread's
    ``config(mode=...)`` block if it is in one, else the process default, and
    ``settings.mode = "eager"`` sets the process default (every thread without an
    override of its own sees it; an enclosing block's override still wins until the
    block ends)."""

    __slots__ = ()  # an unknown name (a typo) is an AttributeError, not a new setting

    def __getattr__(self, name: str):  # only for names that are no setting
        raise _unknown(name)

    def __setattr__(self, name: str, value) -> None:
        if name not in _FIELDS:
            raise _unknown(name)
        object.__setattr__(self, name, value)  # the field's property checks the value

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"torch_pjrt.settings({fields})"


for _name in _FIELDS:
    setattr(_Settings, _name, _setting(_name))
del _name

settings = _Settings()


def op_path(_get=_scoped.get, _values=_values, _recording=_recording) -> str:
    """How ops run now, in one read of the settings (per-op hot path, about 40 ns
    against 55 ns a field): ``"checked"`` when a per-op check is on (``check_nan``,
    ``check_numerics``), else the mode (``"debug"``, ``"eager"``, ``"fused"``);
    ``"fused"`` while a graph is captured."""
    if _recording[0]:
        return "fused"
    scoped = _get()
    if scoped is None:
        if _values["check_nan"] or _values["check_numerics"]:
            return "checked"
        return _values["mode"]
    get = scoped.get
    if get("check_nan", _values["check_nan"]) or get("check_numerics", _values["check_numerics"]):
        return "checked"
    return get("mode", _values["mode"])


def _overridden(name: str, scoped: dict | None):
    """Field ``name`` as it reads in a context whose overrides are ``scoped``."""
    if scoped is not None and name in scoped:
        return scoped[name]
    return _values[name]


def config(**overrides):
    """Override settings inside a ``with`` block (or a function, as a decorator).

    The overrides hold for the thread (or asyncio task) that entered the block: other
    threads keep their own settings. Blocks nest; each restores what was in effect
    before it. The values are checked at the call, before the block starts.

    Args:
        overrides: fields of :class:`Config`, such as ``fallback="error"``.

    Example:
        >>> with torch_pjrt.config(fallback="error"):
        ...     y = x.to("pjrt") + 1
    """
    unknown = set(overrides) - set(_FIELDS)
    if unknown:
        raise TypeError(
            f"torch_pjrt.config() got unknown settings: {sorted(unknown)}; the settings "
            f"are: {', '.join(_FIELDS)}"
        )
    return _scope({name: _check(name, value) for name, value in overrides.items()})


@contextlib.contextmanager
def _scope(overrides: dict):
    outer = _scoped.get()
    switches = "mode" in overrides
    if switches:
        _mode_switch(_overridden("mode", outer), overrides["mode"])
    token = _scoped.set(overrides if outer is None else {**outer, **overrides})
    try:
        yield settings
    finally:
        try:
            if switches:
                _mode_switch(overrides["mode"], _overridden("mode", outer))
        finally:
            _scoped.reset(token)
