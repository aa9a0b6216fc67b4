"""`llmmem estimate --quant-compute-dtype`: the dtype bitsandbytes dequantizes each 4-bit weight
to for its matmul (bnb_4bit_compute_dtype), as a file's BitsAndBytesConfig or ms-swift's
float16 default (fp32 compute) gives it."""

from __future__ import annotations

from estimate_runs import estimate, report

# ms-swift's float16 QLoRA: no k-bit preparation, no autocast; the 4-bit layers' compute dtype
# is then the dtype of their inputs and of the residual stream between them
BASE = ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--method", "qlora", "--batch", "2"]
BASE += ["--precision", "fp16-true", "--no-kbit-prepare"]


def test_fp32_compute_dequantizes_to_fp32() -> None:
    bf16 = report(*BASE)
    fp32 = report(*BASE, "--quant-compute-dtype", "fp32")
    assert bf16["setup"]["values"]["quant"]["compute_dtype_bytes"] == 2
    assert fp32["setup"]["values"]["quant"]["compute_dtype_bytes"] == 4
    assert fp32["allocated_peak_bytes"] > 1.3 * bf16["allocated_peak_bytes"]
    assert report(*BASE, "--quant-compute-dtype", "bf16") == bf16


def test_without_a_4_bit_base_the_flag_is_refused() -> None:
    done = estimate("--model", "Qwen/Qwen2.5-1.5B-Instruct", "--quant-compute-dtype", "fp32")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "llmmem: error: --quant-compute-dtype needs --quant nf4 or fp4 (or --method qlora)"
    )
