"""Activation offloading in a measured step: what TRL's `OffloadActivations` keeps on the device.

TRL 0.29.1 (`trl/models/activation_offloading.py`, ported from torchtune 0.6) installs
saved-tensor hooks around the loss computation. Its rules, as this step follows them:

- a saved tensor is offloaded unless it is smaller than 1,024 bytes, a parameter or buffer, or
  a storage already offloaded in this forward (then it stays where it is);
- with streams (the default) the device copy of an offloaded tensor is kept until five more
  tensors have been packed after it (`max_fwd_stash_size`): the copy to the host overlaps
  compute, so the last few offloaded tensors are still on the device;
- the output head runs under a no-op hook manager: its saved input stays on the device;
- in backward a tensor is brought back when its autograd node asks for it (or taken from the
  forward stash if it is still there), and the tensors of the previous node are freed when the
  next node starts unpacking.

TRL offloads only CUDA, XPU and NPU tensors. Here the host copy is kept outside torch's
allocator (a NumPy buffer on the CPU, nothing for fake tensors), so the storage tracker sees
what a GPU would hold: the device copies that are alive, and the ones brought back.
"""

from __future__ import annotations

from typing import Any

MIN_OFFLOAD_BYTES = 1024
MAX_FWD_STASH = 5


class OffloadedActivations:
    """Saved-tensor hooks that move activations off the measured device (see module doc)."""

    def __init__(self, torch: Any, model: Any, dedupe: bool = False) -> None:
        self.torch = torch
        self.dedupe = dedupe
        self.params = {self._key(p) for p in list(model.parameters()) + list(model.buffers())}
        self.next_id = 0
        self.tracker: dict[int, Any] = {}
        self.fwd_stash: dict[int, Any] = {}
        self.offloaded_storages: set[int] = set()
        self.bwd_stash: dict[int, Any] = {}
        self.node: Any = None
        self.paused = 0
        head = self._head(model)
        self.handles = []
        if head is not None:
            self.handles.append(head.register_forward_pre_hook(self._pause))
            self.handles.append(head.register_forward_hook(self._resume, always_call=True))
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    @staticmethod
    def _key(t: Any) -> int:
        return int(t.untyped_storage()._cdata)

    @staticmethod
    def _head(model: Any) -> Any:
        for candidate in (model, getattr(model, "base_model", None)):
            getter = getattr(candidate, "get_output_embeddings", None)
            if getter is not None:
                head = getter()
                if head is not None:
                    return head
        return None

    def _pause(self, *_: Any) -> None:
        self.paused += 1

    def _resume(self, *_: Any) -> None:
        self.paused = max(self.paused - 1, 0)

    def __enter__(self) -> OffloadedActivations:
        """Around a forward: its saved tensors go through the hooks."""
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.__exit__(*exc)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()

    def _pack(self, t: Any) -> Any:
        torch = self.torch
        tensor_id = self.next_id
        self.next_id += 1
        if self.paused or isinstance(t, torch.nn.Parameter):
            return ("kept", t)
        try:
            key = self._key(t)
        except (RuntimeError, NotImplementedError):
            return ("kept", t)
        if key in self.params:
            return ("kept", t)
        if self.dedupe and key in self.offloaded_storages:
            # TRL keeps a second save of a storage it is still offloading on the device
            return ("kept", t)
        if t.numel() * t.element_size() < MIN_OFFLOAD_BYTES:
            return ("kept", t)
        # the copies the hooks made more than MAX_FWD_STASH packs ago have reached the host
        for old in [i for i in self.fwd_stash if i <= tensor_id - MAX_FWD_STASH]:
            self.offloaded_storages.discard(self._key(self.fwd_stash.pop(old)))
        host = None
        if t.device.type != "cpu" and not _is_fake(t):
            host = t.detach().to("cpu", copy=True)  # a GPU's tensor: host memory, not its own
        elif not _is_fake(t):
            host = t.detach().contiguous().view(-1).view(torch.uint8).numpy().copy()
        self.tracker[tensor_id] = (host, tuple(t.shape), t.dtype, t.device)
        self.fwd_stash[tensor_id] = t
        self.offloaded_storages.add(key)
        return ("offloaded", tensor_id)

    def _unpack(self, packed: Any) -> Any:
        kind, value = packed
        if kind == "kept":
            return value
        torch = self.torch
        self.offloaded_storages.clear()  # backward has begun: the next forward starts anew
        node = torch._C._current_autograd_node()
        if node is not self.node:
            self.node = node
            self.bwd_stash.clear()  # the previous node's tensors are freed
        if value in self.fwd_stash:
            t = self.fwd_stash.pop(value)
            self.tracker.pop(value, None)
            self.bwd_stash[value] = t
            return t
        host, shape, dtype, device = self.tracker.pop(value)
        t = torch.empty(shape, dtype=dtype, device=device)
        if isinstance(host, torch.Tensor):
            t.copy_(host)
        elif host is not None:
            t.view(-1).view(torch.uint8).copy_(torch.from_numpy(host))
        self.bwd_stash[value] = t
        return t

    def end_of_backward(self) -> None:
        """What autograd's final callback does: every brought-back tensor is released."""
        self.bwd_stash.clear()
        self.fwd_stash.clear()
        self.node = None


def _is_fake(t: Any) -> bool:
    return type(t).__name__ == "FakeTensor"
