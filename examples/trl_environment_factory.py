#!/usr/bin/env python3
"""Train with TRL's GRPOTrainer on a Concord environment, reached over OpenEnv.

TRL 1.16's `environment_factory` gives every rollout its own environment instance:
`reset(**row)` returns the text appended to the prompt, the instance's public methods
become tools the model calls, and `get_reward()` scores the finished rollout. Here each
instance holds one OpenEnv session on a `concord serve ENV` server (openenv's own
`GenericEnvClient`, over WebSocket), so the episodes, their seeds and their rewards are
exactly the ones `concord train` and `concord eval` play.

Start a server, then train (a few steps on Concord's built-in tiny model):

    target/release/concord model init-tiny --out /tmp/tiny
    target/release/concord serve ticketmelt --port 8000 --max-sessions 64 &
    python examples/trl_environment_factory.py --url http://127.0.0.1:8000 \
        --model /tmp/tiny --steps 3

A rollout reaches the environment only when the model writes its chat template's
tool-call format (Qwen's `<tool_call>` tags); a random model never does. `--write-demos`
writes demonstrations of the format for `concord sft`, and `--adapter` starts TRL from
the adapter it trains (the recipe: examples/trl_toolcall_sft.toml).

Needs `pip install trl==1.16.0 "transformers>=5.2" torch peft openenv==0.10.0`. This is
an example for Python users, not part of Concord's build or CI.

How a rollout goes: the prompt says to answer through the `act` tool; `reset` starts
the episode with the row's `seed` and appends the environment's instructions and first
observation; every `act(answer)` plays one turn and returns the next observation (or the
final reward); the rollout ends when the model stops calling `act`, the episode ends, or
`--max-turns` calls were made. `get_reward` is the sum of the rewards the environment
gave (for the built-in environments, the episode's score once it is over; 0 for an
episode the model left unfinished).
"""
import argparse
import json
import sys

INSTRUCTION = (
    "You play one seat of a multi-agent environment. Every turn, call the `act` tool "
    "with your answer, written exactly as the instructions below ask; the tool returns "
    "what you observe next. Keep calling it until it says the episode is over.\n\n"
)

# The environments ask for a bare answer; a small model copies a concrete example of the
# tool call better than it follows a description of one (Qwen2.5's `<tool_call>` format).
HOW_TO_ANSWER = (
    "\n\nDo not answer in plain text: send your answer through the `act` tool, like this "
    "(with your own answer):\n<tool_call>\n"
    '{"name": "act", "arguments": {"answer": "YOUR ANSWER"}}\n</tool_call>'
)


class ConcordEnv:
    """One Concord episode over OpenEnv, one instance per rollout (TRL pools and resets them)."""

    url = None  # set by main(): TRL calls the factory with no arguments

    def __init__(self):
        from openenv.core.generic_client import GenericEnvClient

        self._client = GenericEnvClient(base_url=self.url).sync()
        self._client.connect()
        self._rewards = []
        self._done = True

    def reset(self, seed=None, **_row):
        r = self._client.reset(seed=seed)
        self._rewards, self._done = [], r.done
        return "\n\n".join(m["content"] for m in r.observation["messages"]) + HOW_TO_ANSWER

    def act(self, answer: str) -> str:
        """Play your answer for this turn of the episode.

        Args:
            answer: Your answer for this turn, written exactly as the instructions ask.

        Returns:
            What you observe next, or your reward once the episode is over.
        """
        if self._done:
            # TRL counts a raised error as a failed tool call and shows the model its text
            raise ValueError("the episode is over: stop calling act")
        if not isinstance(answer, str):
            # a JSON answer written as an object instead of a quoted string
            answer = json.dumps(answer)
        r = self._client.step({"message": answer})
        self._rewards.append(r.reward or 0.0)
        self._done = r.done
        if r.done:
            return f"The episode is over. Your reward: {sum(self._rewards):.3f}"
        obs = r.observation
        feedback = obs.get("feedback") or ""
        note = f"(your last answer: {feedback})\n\n" if feedback else ""
        return note + obs["messages"][-1]["content"] + HOW_TO_ANSWER

    def get_reward(self) -> float:
        return float(sum(self._rewards))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the `concord serve` server, http://HOST:PORT")
    p.add_argument("--model", help="a local transformers model directory")
    p.add_argument("--play", metavar="ANSWER",
                   help="no training: play episode --first-seed through the tools TRL calls, "
                        "answering ANSWER every turn, and print each reward")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps (TRL max_steps)")
    p.add_argument("--num-generations", type=int, default=4, help="completions per prompt")
    p.add_argument("--prompts-per-step", type=int, default=1)
    p.add_argument("--max-completion-length", type=int, default=2048,
                   help="tokens of the whole rollout: answers and tool results")
    p.add_argument("--max-turns", type=int, default=8, help="TRL max_tool_calling_iterations")
    p.add_argument("--first-seed", type=int, default=0, help="episode seeds: first, first+1, ...")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (TRL's default 1.0)")
    p.add_argument("--no-lora", action="store_true", help="train every weight instead of LoRA r8")
    p.add_argument("--output", default="trl-concord-run", help="TRL output_dir (the adapter)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=0,
                   help="print this many rollouts per step (TRL log_completions)")
    p.add_argument("--adapter", help="a PEFT adapter (e.g. a `concord sft` warm start) "
                                     "merged into --model before training")
    p.add_argument("--write-demos", metavar="FILE",
                   help="no training: write tool-call demonstrations for `concord sft` "
                        "(source = \"jsonl\") to FILE and stop; needs --model and --answers")
    p.add_argument("--demos", type=int, default=16,
                   help="episodes to demonstrate (one demonstration per turn)")
    p.add_argument("--answers", nargs="+", metavar="ANSWER",
                   help="the demonstrations' answers, one per episode in turn")
    return p.parse_args(argv)


def write_demos(args):
    """Tool-call demonstrations, for a model that does not write the tool-call tags.

    Episodes --first-seed, +1, ... are played through the `act` tool, turn `t` of
    episode `i` answering with --answers[(i + t) % len]. Each turn is one line: the
    conversation TRL builds up to it (the chat template's tool system message, the
    instruction and the observation `reset` appends, then every earlier call and the
    tool's reply) and, as the completion, the turn's `act` call in the template's
    `<tool_call>` format. `concord sft` on them teaches the format and to keep calling
    until the episode is over; the answers are whatever the caller chose, not a policy.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    ConcordEnv.url = args.url
    env = ConcordEnv()
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "X"}], tools=[env.act], tokenize=False)
    head = "<|im_start|>system\n"
    if head not in rendered:
        sys.exit("--write-demos: the model's chat template has no system message for tools")
    system = rendered.split(head, 1)[1].split("<|im_end|>", 1)[0]
    lines = 0
    with open(args.write_demos, "w") as f:
        for i in range(args.demos):
            first = env.reset(seed=args.first_seed + i)
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": INSTRUCTION + first}]
            turn = 0
            while not env._done:
                answer = args.answers[(i + turn) % len(args.answers)]
                call = json.dumps({"name": "act", "arguments": {"answer": answer}})
                completion = f"<tool_call>\n{call}\n</tool_call>"
                f.write(json.dumps({"messages": messages, "completion": completion}) + "\n")
                reply = env.act(answer)
                messages = messages + [{"role": "assistant", "content": completion},
                                       {"role": "tool", "content": reply}]
                turn += 1
                lines += 1
    print(f"wrote {lines} demonstrations ({args.demos} episodes) to {args.write_demos}")


def main(argv):
    args = parse_args(argv)
    if args.play is not None:
        return play(args)
    if args.model is None:
        sys.exit("--model is required to train (or --play ANSWER to try the tools)")
    if args.write_demos:
        if not args.answers:
            sys.exit("--write-demos needs --answers")
        return write_demos(args)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    ConcordEnv.url = args.url
    rows = args.steps * args.prompts_per_step
    seeds = list(range(args.first_seed, args.first_seed + rows))
    data = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": INSTRUCTION}] for _ in seeds],
        "seed": seeds,
    })
    tokenizer = AutoTokenizer.from_pretrained(args.model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="float32")
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()
    peft_config = None
    if not args.no_lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                            "gate_proj", "up_proj", "down_proj"],
        )
    config = GRPOConfig(
        output_dir=args.output,
        max_steps=args.steps,
        per_device_train_batch_size=args.num_generations * args.prompts_per_step,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=args.seed,
        shuffle_dataset=False,
        log_completions=args.show > 0,
        num_completions_to_print=args.show or None,
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        environment_factory=ConcordEnv,
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(args.output)
    print("\nstep  reward  ConcordEnv  tool calls/rollout  tool failures  completion tokens")
    for h in trainer.state.log_history:
        if "reward" in h:
            print(f"{h.get('step', '?'):>4}  {h['reward']:6.3f}  "
                  f"{h.get('rewards/ConcordEnv/mean', float('nan')):10.3f}  "
                  f"{h.get('tools/call_frequency', 0.0):18.2f}  "
                  f"{h.get('tools/failure_frequency', 0.0):13.2f}  "
                  f"{h.get('completions/mean_length', float('nan')):17.1f}")
    print(f"model or adapter saved in {args.output}")


if __name__ == "__main__":
    main(sys.argv[1:])
