"""Counting allocated memory without a GPU: every storage an op creates, until it dies.

`StorageTracker` is a TorchDispatchMode. Each tensor an op returns is looked at once per storage:
a storage not seen before is counted with its size and the category the running phase gives new
memory ("activations" in forward, "temporaries" in backward and in the step), and forgotten when
the storage is freed (a weakref finalizer on the storage object, which torch keeps alive exactly
as long as the storage). Views and in-place results share a storage and are not counted twice.
This works the same on real CPU tensors and on fake ones (FakeTensorMode), which is what lets a
7B step be "run" in a second on a laptop.

A storage can die on another thread: gloo's worker threads drop their reference to a collective's
input after the main thread has moved on. The bookkeeping is locked, so such a free is never
lost against a count the main thread is making.

Known storages can be (re)classified: the parameters before the step, the gradients at the end of
backward, the optimizer states after it; the totals by category at each phase's peak are kept.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from llmmem.verify.request import ACTIVATIONS, CATEGORIES, OTHER, TEMPORARIES


def _storage(t: torch.Tensor) -> Any | None:
    local = getattr(t, "_local_tensor", None)  # a DTensor (FSDP2): its shard on this rank
    if isinstance(local, torch.Tensor):
        t = local
    if t.is_meta:  # shape-only bookkeeping (DeepSpeed keeps meta copies of each parameter)
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


# custom ops whose kernels are Python calling torch ops, and allocate inside what a GPU
# allocates too: bitsandbytes' k-bit matmul dequantizes the weight to a 16-bit temporary (on
# CUDA as well, for more than 1,536 tokens). Its CPU optimizer kernels are not here: they
# make temporaries the fused CUDA kernels do not.
OPAQUE_OPS = {"bitsandbytes::gemm_4bit"}


def _python_kernel_key(func: Any) -> Any:
    """The dispatch key of the kernel `func` runs on the CPU, where it can be called directly."""
    for name in ("CPU", "CompositeExplicitAutograd"):
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), name):
            return getattr(torch._C.DispatchKey, name)
    return None


class StorageTracker(TorchDispatchMode):
    def __init__(self, resizable: bool = False) -> None:
        super().__init__()
        # FSDP2 frees and re-allocates parameter memory by resizing storages in place
        # (`untyped_storage().resize_`), which no dispatched op shows: with `resizable`, sizes
        # are read again before a new peak is taken and at each phase boundary
        self.resizable = resizable
        self.storages: dict[int, weakref.ref[Any]] = {}
        # the storages seen resized (or created empty): FSDP2 grows its unsharded parameters'
        # storages back in place when it gathers them, so these are read again before each
        # new storage is counted, or a gather would stay invisible until something else
        # pushed the count past the peak
        self.resized: dict[int, weakref.ref[Any]] = {}
        self.sizes: dict[int, int] = {}  # id(storage) -> bytes
        self.category: dict[int, str] = {}
        self.totals: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.new_category = OTHER  # what memory created now is
        self.peak = 0
        self.peak_by_category: dict[str, int] = dict(self.totals)
        self.lock = threading.RLock()  # frees can come from communication threads
        # when a list: every allocation as (key, bytes) and every free as (key, -1), in order,
        # for a replay through the caching allocator's rules (verify/allocator.py)
        self.events: list[tuple[int, int]] | None = None

    # -- bookkeeping ------------------------------------------------------------------------

    def _forget(self, key: int) -> None:
        with self.lock:
            self.storages.pop(key, None)
            self.resized.pop(key, None)
            size = self.sizes.pop(key, None)
            if size is None:
                return
            if self.events is not None:
                self.events.append((key, -1))
            self.current -= size
            self.totals[self.category.pop(key, OTHER)] -= size

    def track(self, t: torch.Tensor, category: str | None = None) -> None:
        """Count `t`'s storage (once); `category` re-files a storage already counted."""
        storage = _storage(t)
        if storage is None:
            return
        with self.lock:
            self._track(storage, category)

    def _track(self, storage: Any, category: str | None) -> None:
        key = id(storage)
        if key in self.sizes:
            if category is not None and self.category[key] != category:
                size = self.sizes[key]
                self.totals[self.category[key]] -= size
                self.totals[category] += size
                self.category[key] = category
            return
        size = int(storage.nbytes())
        self.sizes[key] = size
        if self.events is not None:
            self.events.append((key, size))
        chosen = category or self.new_category
        self.category[key] = chosen
        self.totals[chosen] += size
        self.current += size
        weakref.finalize(storage, self._forget, key)
        if self.resizable:
            self.storages[key] = weakref.ref(storage)
            if not size:
                self.resized[key] = self.storages[key]
        self._note_peak()

    def _note_peak(self) -> None:
        if self.resizable:
            self._read_sizes(self.resized)  # gathers grow storages without an op
        if self.current <= self.peak:
            return
        if self.resizable:
            self.resync()
            if self.current <= self.peak:
                return
        self.peak = self.current
        self.peak_by_category = dict(self.totals)

    def resync(self) -> None:
        """Read every live storage's size again (storages resized in place)."""
        self._read_sizes(self.storages)

    def _read_sizes(self, storages: dict[int, weakref.ref[Any]]) -> None:
        for key, ref in list(storages.items()):
            storage = ref()
            if storage is None:
                continue
            size = int(storage.nbytes())
            old = self.sizes.get(key)
            if old is None or size == old:
                continue
            self.sizes[key] = size
            self.current += size - old
            self.totals[self.category.get(key, OTHER)] += size - old
            self.resized[key] = ref

    def reset_peak(self, new_category: str) -> None:
        with self.lock:
            if self.resizable:
                self.resync()
            self.new_category = new_category
            self.peak = self.current
            self.peak_by_category = dict(self.totals)

    def refile(self, old: str, new: str) -> int:
        """Re-file every live storage of category `old` as `new`; the bytes moved."""
        with self.lock:
            if self.resizable:
                self.resync()
            moved = 0
            for key, category in self.category.items():
                if category == old:
                    self.category[key] = new
                    moved += self.sizes[key]
            self.totals[old] -= moved
            self.totals[new] += moved
            return moved

    def bytes_of(self, tensors: list[torch.Tensor]) -> int:
        seen: set[int] = set()
        total = 0
        for t in tensors:
            storage = _storage(t)
            if storage is None or id(storage) in seen:
                continue
            seen.add(id(storage))
            total += int(storage.nbytes())
        return total

    # -- the dispatch hook ------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        key = None
        if func.namespace == "bitsandbytes" and func.name() in OPAQUE_OPS:
            key = _python_kernel_key(func)
        if key is not None:
            # a custom op written in Python: the ops it runs inside would run with this mode
            # popped; call its kernel with the mode pushed again to count what they allocate
            # (the 16-bit weight a k-bit matmul dequantizes)
            with self:
                out = func._op_dk(key, *args, **(kwargs or {}))
        else:
            out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self.track(item)
        return out


__all__ = ["ACTIVATIONS", "TEMPORARIES", "StorageTracker"]
