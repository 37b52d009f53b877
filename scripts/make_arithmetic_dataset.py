#!/usr/bin/env python3
"""Write examples/data/arithmetic.jsonl: the dataset quickstart's 240 rows of two-digit
addition and subtraction, in both of TRL's prompt layouts (a string, and a conversation),
each with its reference `answer` and the `completion` SFT imitates. Seeded: running it
again writes the same file."""
import json
import pathlib
import random

r = random.Random(20261207)
out = pathlib.Path(__file__).resolve().parent.parent / "examples/data/arithmetic.jsonl"
with out.open("w") as f:
    for i in range(240):
        a, b = r.randint(10, 99), r.randint(10, 99)
        op = r.choice(["+", "-"])
        ans = a + b if op == "+" else a - b
        q = f"What is {a} {op} {b}? Reply as <answer>NUMBER</answer>."
        row = {"id": f"arith-{i:03d}"}
        row["prompt"] = q if i % 2 == 0 else [{"role": "user", "content": q}]
        row["answer"] = str(ans)
        row["completion"] = f"<answer>{ans}</answer>"
        f.write(json.dumps(row) + "\n")
