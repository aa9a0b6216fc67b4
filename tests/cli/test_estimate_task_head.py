"""`llmmem estimate --task`: the model under a task head, as a file's
`AutoModelForSequenceClassification` loads it (the same rule on both roads), and clear refusals."""

from __future__ import annotations

from estimate_runs import estimate, report

LLAMA_32_1B = 1_235_814_400  # LlamaForCausalLM, its head tied to the embedding
HIDDEN = 2048


def test_a_sequence_classifier_has_its_head_and_no_vocabulary_logits() -> None:
    base = ["--model", "meta-llama/Llama-3.2-1B", "--method", "full", "--batch", "4"]
    lm = report(*base)
    classifier = report(*base, "--task", "sequence-classification", "--num-labels", "3")
    assert classifier["model"]["architecture"] == "LlamaForSequenceClassification"
    # the tied vocabulary head goes, a bias-free score of hidden × labels comes
    assert classifier["model"]["params"] == LLAMA_32_1B + HIDDEN * 3
    # the LM's fp32 logits at the start of backward: 12 B × 4 × 1024 tokens × 128,256 entries
    logits = 12 * 4 * 1024 * 128_256
    assert lm["components"]["logits"] == logits
    assert "logits" not in classifier["components"]
    assert classifier["allocated_peak_bytes"] <= lm["allocated_peak_bytes"] - logits


def test_the_default_head_is_the_language_models() -> None:
    plain = report("--model", "meta-llama/Llama-3.2-1B")
    causal = report("--model", "meta-llama/Llama-3.2-1B", "--task", "causal-lm")
    assert plain["allocated_peak_bytes"] == causal["allocated_peak_bytes"]


def test_num_labels_without_a_task_head_is_refused() -> None:
    done = estimate("--model", "meta-llama/Llama-3.2-1B", "--num-labels", "3")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "llmmem: error: --num-labels needs --task with a task head"
    ]
    done = estimate(
        "--model", "bert-base-uncased", "--task", "token-classification", "--num-labels", "0"
    )
    assert done.returncode != 0 and "--num-labels must be at least 1" in done.stderr
    assert "Traceback" not in done.stderr
