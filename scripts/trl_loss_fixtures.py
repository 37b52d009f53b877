#!/usr/bin/env python3
"""GRPO-math fixtures from TRL 1.16 itself: the newer losses, entropy masking, the
sampler/trainer correction and GDPO advantages, on small hand-made inputs.

A developer tool (never a CI or runtime dependency). Run from the repository root:

    /work/.venv-trl/bin/python scripts/trl_loss_fixtures.py

The loss cases run TRL's own `GRPOTrainer._compute_loss` (with its own
`get_high_entropy_mask`, `get_off_policy_mask` and `get_gamma_weights`) on a stand-in
`self` whose model "forward" returns the given per-token log-probs and entropies as leaf
tensors, so the fixture holds TRL's loss, its gradients with respect to the log-probs and
the entropies, and the metrics it logs. Two formulas live inline in TRL's
`_generate_and_score_completions` and cannot be called on their own: the importance
sampling ratio (vLLM correction) and the `normalize_then_sum` advantages; they are
transcribed below line by line (float64), using TRL's `nanstd`.

Writes tests/fixtures/trl_grpo.json (read by tests/grpo_math.rs).
"""
import json
import math
import os
import types
from collections import defaultdict

import torch
import trl
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "trl_grpo.json")

torch.set_default_dtype(torch.float64)


class OneProcess:
    """accelerate's Accelerator on a single process: every collective is the identity."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x

    def gather_for_metrics(self, x):
        return x


# Three completions of up to five tokens; row 1 is shorter, row 2 has one env token.
LOGP = [
    [-1.0, -2.0, -0.5, -0.3, -1.2],
    [-0.3, -1.2, -2.0, -0.9, -0.1],
    [-0.7, -0.2, -1.6, -2.4, -0.05],
]
OLD = [
    [-1.1, -1.8, -0.5, -1.3, -1.0],
    [-0.3, -1.5, -1.0, -0.9, -0.1],
    [-0.2, -0.4, -1.5, -2.0, -0.3],
]
# The sampler's log-probs: the old ones, perturbed (bf16-like drift and a few large ones).
SAMPLER = [
    [-1.15, -1.7, -0.52, -1.9, -1.0],
    [-0.31, -1.45, -2.2, -0.9, -0.1],
    [-0.9, -0.38, -1.52, -2.05, -0.31],
]
MASK = [
    [1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0],
    [1, 1, 0, 1, 1],
]
ADV = [1.0, -2.0, 0.5]
ENTROPY = [
    [2.1, 0.3, 1.7, 0.9, 2.6],
    [0.2, 3.1, 1.1, 0.4, 0.8],
    [1.3, 0.6, 2.2, 2.9, 0.1],
]
REF = [
    [-0.9, -2.1, -0.7, -0.4, -1.0],
    [-0.4, -1.0, -1.5, -0.8, -0.2],
    [-0.6, -0.3, -1.4, -2.2, -0.1],
]
MAX_COMPLETION_LENGTH = 6


def is_ratio(old, sampler, mask, mode, clip_min, clip_max):
    """TRL 1.16's vLLM importance-sampling ratio (_generate_and_score_completions)."""
    per_token_logps_diff = (old - sampler) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    if mode in ["sequence_mask", "sequence_truncate"]:
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        min_val = clip_min if clip_min is not None else -math.inf
        max_val = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)
    # The metrics TRL logs with it.
    delta = torch.abs(old - sampler)[mask.bool()]
    flat = ratio.flatten() if mode.startswith("sequence") else ratio[mask.bool()]
    metrics = {
        "sampling/sampling_logp_difference/mean": delta.mean().item(),
        "sampling/sampling_logp_difference/max": delta.max().item(),
        "sampling/importance_sampling_ratio/min": flat.min().item(),
        "sampling/importance_sampling_ratio/mean": flat.mean().item(),
        "sampling/importance_sampling_ratio/max": flat.max().item(),
    }
    return ratio, metrics


def run_case(name, loss_type, level="token", epsilon=0.2, epsilon_high=None, beta=0.0,
             top_entropy_quantile=1.0, entropy_coef=0.0, correction=None,
             off_policy_mask_threshold=None, **extra):
    args = types.SimpleNamespace(
        delta=None, use_bias_correction_kl=False,
        sapo_temperature_pos=extra.get("sapo_temperature_pos", 1.0),
        sapo_temperature_neg=extra.get("sapo_temperature_neg", 1.05),
        vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
        steps_per_generation=1, entropy_target=0.2,
    )
    logp = torch.tensor(LOGP, requires_grad=True)
    entropies = torch.tensor(ENTROPY, requires_grad=True)
    mask = torch.tensor(MASK, dtype=torch.float64)
    old = torch.tensor(OLD)
    sampler = torch.tensor(SAMPLER)

    s = types.SimpleNamespace()
    s.accelerator = OneProcess()
    s.model = types.SimpleNamespace(training=True)
    s.current_gradient_accumulation_steps = 1
    s.args = args
    s.loss_type = loss_type
    s.importance_sampling_level = level
    s.epsilon_low = epsilon
    s.epsilon_high = epsilon_high if epsilon_high is not None else epsilon
    s.beta = beta
    s.max_completion_length = MAX_COMPLETION_LENGTH
    s.top_entropy_quantile = top_entropy_quantile
    s.off_policy_mask_threshold = off_policy_mask_threshold
    s.entropy_coef = entropy_coef
    s.use_adaptive_entropy = False
    s._entropy_bonus_enabled = entropy_coef != 0.0
    s.aux_loss_enabled = False
    s.use_vllm = correction is not None
    s.vllm_importance_sampling_correction = correction is not None
    s._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    s.get_high_entropy_mask = types.MethodType(GRPOTrainer.get_high_entropy_mask, s)
    s.get_off_policy_mask = GRPOTrainer.get_off_policy_mask
    s.get_gamma_weights = GRPOTrainer.get_gamma_weights
    s._get_per_token_logps_and_entropies = lambda *a, **k: (logp, entropies, None)

    inputs = {
        "prompt_ids": torch.zeros((3, 1), dtype=torch.long),
        "prompt_mask": torch.ones((3, 1), dtype=torch.long),
        "completion_ids": torch.zeros((3, 5), dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.tensor(ADV),
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
        "sampling_per_token_logps": sampler,
    }
    if beta != 0.0:
        inputs["ref_per_token_logps"] = torch.tensor(REF)
    metrics = {}
    if correction is not None:
        ratio, m = is_ratio(old, sampler, mask, **correction)
        inputs["importance_sampling_ratio"] = ratio
        metrics.update(m)
    loss = GRPOTrainer._compute_loss(s, None, inputs)
    loss.backward()
    for k, v in s._metrics["train"].items():
        metrics[k] = v[-1]
    return {
        "name": name,
        "loss_type": loss_type,
        "level": level,
        "epsilon": epsilon,
        "epsilon_high": s.epsilon_high,
        "beta": beta,
        "top_entropy_quantile": top_entropy_quantile,
        "entropy_coef": entropy_coef,
        "correction": correction,
        "off_policy_mask_threshold": off_policy_mask_threshold,
        "sapo_temperature_pos": args.sapo_temperature_pos,
        "sapo_temperature_neg": args.sapo_temperature_neg,
        "loss": loss.item(),
        "grad_logp": logp.grad.tolist(),
        "grad_entropy": entropies.grad.tolist() if entropies.grad is not None else None,
        "metrics": metrics,
    }


def gdpo(rewards_per_func, weights, num_generations):
    """TRL 1.16's `normalize_then_sum` advantages (_generate_and_score_completions)."""
    rewards_per_func = torch.tensor(rewards_per_func)
    reward_weights = torch.tensor(weights)
    k = rewards_per_func.shape[1]
    grouped = rewards_per_func.view(-1, num_generations, k)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
    reward_k = (grouped - mean_k) / (std_k + 1e-4)
    reward_k = reward_k.view(-1, k)
    rewards = (reward_k * reward_weights.unsqueeze(0)).nansum(dim=1)
    std_rewards = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    advantages = (rewards - torch.nanmean(rewards)) / (std_rewards + 1e-4)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    return advantages.tolist()


def main():
    cases = [
        run_case("cispo_default_cap", "cispo"),
        run_case("cispo_scalerl", "cispo", epsilon_high=1.2),
        run_case("sapo", "sapo"),
        run_case("sapo_sequence", "sapo", level="sequence",
                 sapo_temperature_pos=0.8, sapo_temperature_neg=1.3),
        run_case("luspo_sequence", "luspo", level="sequence"),
        run_case("vespo", "vespo"),
        run_case("vespo_token_truncate", "vespo",
                 correction=dict(mode="token_truncate", clip_min=None, clip_max=1.5)),
        run_case("dapo_sequence_mask", "dapo",
                 correction=dict(mode="sequence_mask", clip_min=None, clip_max=3.0)),
        run_case("dapo_sequence_truncate", "dapo",
                 correction=dict(mode="sequence_truncate", clip_min=0.5, clip_max=1.2)),
        run_case("dapo_token_mask", "dapo",
                 correction=dict(mode="token_mask", clip_min=0.9, clip_max=1.1)),
        run_case("grpo_token_truncate", "grpo",
                 correction=dict(mode="token_truncate", clip_min=None, clip_max=1.1)),
        run_case("dapo_off_policy_mask", "dapo", off_policy_mask_threshold=0.05),
        run_case("dapo_top_entropy", "dapo", top_entropy_quantile=0.25),
        run_case("dapo_entropy_bonus", "dapo", entropy_coef=0.1, top_entropy_quantile=0.5),
        run_case("grpo_entropy_bonus", "grpo", entropy_coef=0.05),
        run_case("grpo_clip_extremes", "grpo", epsilon=0.1, beta=0.04),
        run_case("bnpo_sequence_clip", "bnpo", level="sequence", epsilon=0.05),
    ]
    rewards = [[1.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 0.5],
               [0.2, 2.0], [0.2, 2.0], [0.7, -1.0], [0.1, 4.0]]
    gdpo_cases = [
        dict(name="two_components", rewards=rewards, components=["a", "b"],
             weights=[1.0, 0.5], num_generations=4,
             advantages=gdpo(rewards, [1.0, 0.5], 4)),
        dict(name="one_constant_group", rewards=rewards, components=["a", "b"],
             weights=[2.0, 1.0], num_generations=2,
             advantages=gdpo(rewards, [2.0, 1.0], 2)),
    ]
    fixture = dict(
        trl_version=trl.__version__,
        inputs=dict(logp=LOGP, old=OLD, sampler=SAMPLER, mask=MASK, advantages=ADV,
                    entropy=ENTROPY, ref=REF, max_completion_length=MAX_COMPLETION_LENGTH),
        loss_cases=cases,
        gdpo_cases=gdpo_cases,
    )
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1)
    print(f"wrote {OUT} ({len(cases)} loss cases, {len(gdpo_cases)} GDPO cases, trl {trl.__version__})")


if __name__ == "__main__":
    main()
