"""The storage counter behind simulated and CPU steps, on real CPU tensors.

FSDP2 frees and re-gathers parameters by resizing their storages in place, and gloo's worker
threads drop collective tensors off the main thread: the two ways memory changes without an op
the counter sees on its own thread.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from llmmem.verify.request import ACTIVATIONS  # noqa: E402
from llmmem.verify.tracker import StorageTracker  # noqa: E402

MIB = 2**20


def test_a_storage_grown_in_place_counts_in_the_next_peak() -> None:
    tracker = StorageTracker(resizable=True)
    with tracker:
        gathered = torch.ones(1024)  # an unsharded parameter, as FSDP2 allocates it
        gathered.untyped_storage().resize_(0)  # resharded after forward
        tracker.reset_peak(ACTIVATIONS)  # a phase boundary reads every size again
        transient = torch.ones(MIB // 2)  # 2 MiB, then freed: the peak so far
        del transient
        gathered.untyped_storage().resize_(4 * MIB)  # gathered again: no op, no new storage
        small = torch.zeros(16)  # the next op's output
    # the gather is counted although the count before it never passed the earlier peak
    assert tracker.peak == 4 * MIB + small.untyped_storage().nbytes()
    assert tracker.current == tracker.peak


def test_without_resizing_a_grown_storage_keeps_its_first_size() -> None:
    # what the flag is for: a counter that does not read sizes again misses the gather
    tracker = StorageTracker(resizable=False)
    with tracker:
        gathered = torch.ones(1024)
        gathered.untyped_storage().resize_(MIB)
        torch.zeros(16)
    assert tracker.peak == 4096 + 64


def test_a_storage_freed_on_another_thread_is_forgotten() -> None:
    tracker = StorageTracker()
    with tracker:
        held = [torch.ones(MIB // 4)]  # 1 MiB
    assert tracker.current == MIB

    def drop() -> None:
        held.clear()  # the last reference dies here, as in a gloo worker

    worker = threading.Thread(target=drop)
    worker.start()
    worker.join()
    assert tracker.current == 0
    assert tracker.peak == MIB


def test_the_weight_a_kbit_matmul_dequantizes_is_counted() -> None:
    """bitsandbytes' 4-bit matmul is one custom op whose kernel dequantizes the weight to a
    16-bit temporary (as CUDA does beyond 1,536 tokens); the counter looks inside it."""
    bnb = pytest.importorskip("bitsandbytes")
    out_features, in_features, tokens = 512, 1024, 8
    layer = bnb.nn.Linear4bit(
        in_features, out_features, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4"
    )
    layer.weight = bnb.nn.Params4bit(
        torch.randn(out_features, in_features), requires_grad=False, quant_type="nf4"
    ).to("cpu")
    x = torch.randn(tokens, in_features, dtype=torch.bfloat16)
    tracker = StorageTracker()
    with tracker:
        tracker.track(layer.weight)  # the packed weight, there before the step
        before = tracker.current
        tracker.reset_peak(ACTIVATIONS)
        y = layer(x)
    dequantized = 2 * out_features * in_features
    output = 2 * tokens * out_features
    assert y.shape == (tokens, out_features)
    assert tracker.peak - before >= dequantized + output
    assert tracker.current - before == output  # the temporary is gone with the op
