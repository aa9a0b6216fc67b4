"""PPO scripts name the value and reward models beside the policy: each is read and sized."""

from __future__ import annotations

from pathlib import Path

from llmmem.extract import extract_plan
from llmmem.preference_plan import ppo_setup

SCRIPT = """\
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
from trl.experimental.ppo import PPOConfig, PPOTrainer

args = PPOConfig(output_dir="o", per_device_train_batch_size=4, response_length=128)
policy = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct")
value = AutoModelForSequenceClassification.from_pretrained("Qwen/Qwen2.5-0.5B", num_labels=1)
reward = AutoModelForSequenceClassification.from_pretrained(
    "meta-llama/Llama-3.2-1B", num_labels=1
)
PPOTrainer(args=args, model=policy, ref_model=None, reward_model=reward, value_model=value,
           train_dataset=None).train()
"""


def test_the_value_and_reward_models_are_the_ones_the_script_loads(tmp_path: Path) -> None:
    path = tmp_path / "ppo.py"
    path.write_text(SCRIPT, encoding="utf-8")
    plan = extract_plan(path)
    assert plan.extra["value_model_id"].value == "Qwen/Qwen2.5-0.5B"
    assert plan.extra["reward_model_id"].value == "meta-llama/Llama-3.2-1B"
    assert plan.extra["value_model_id"].range is not None  # the hover can point at it
    setup = ppo_setup(plan)
    assert setup.value_model is not None and setup.reward_model is not None
    # sized as the models they are, not as the 1.5B policy
    assert 0.4e9 < setup.value_model.total_params < 0.6e9
    assert 1.1e9 < setup.reward_model.total_params < 1.3e9
