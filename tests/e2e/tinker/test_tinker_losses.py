"""Tinker's cispo, dro and gspo, and forward_backward_custom (a DPO-like pair loss and a linear
loss with negative weights), through the official SDK against the real trainer worker, each
against the same loss computed in-process: the formula as Thinking Machines document it,
written out here and differentiated by autograd through the same tiny Llama and LoRA (same
seed), then the same AdamW step. The loss values must agree, and the weights after the step
(seen through each side's forward logprobs) must too, which they do only if the gradients do."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tinker import types

from tests.e2e.tinker.test_tinker_sdk import SEQUENCES, WAIT_S, datum

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
# eps=1 keeps AdamW's first step proportional to the gradient (|g| << 1), not its sign
ADAM = {"learning_rate": 0.5, "beta1": 0.9, "beta2": 0.95, "eps": 1.0}
ADAM |= {"weight_decay": 0.0, "grad_clip_norm": 0.0}
TOL = 2e-4  # float32 on both sides; padded batches vs one sequence at a time


def _cispo(lp, q, a, c):
    ratio = torch.exp(lp - q).clamp(c["clip_low_threshold"], c["clip_high_threshold"])
    return -(ratio.detach() * lp * a).sum()


def _dro(lp, q, a, c):
    return -(lp * a - 0.5 * c["beta"] * (lp - q) ** 2).sum()


def _gspo(lp, q, a, c, mask):
    log_ratio = (lp.detach() - q)[mask != 0].mean()
    ratio = torch.exp(log_ratio + lp - lp.detach())
    clipped = ratio.clamp(c["clip_low_threshold"], c["clip_high_threshold"])
    return -torch.min(ratio * a, clipped * a).sum()


def _inproc_step(trainer, pid, loss_of) -> float:
    """The loss on the model's own logprobs (one sequence at a time), backward, AdamW."""
    state = trainer.activate(pid)
    trainer.model.train()
    lps = []
    for s in SEQUENCES:
        logits = trainer.model(input_ids=torch.tensor([s[:-1]])).logits.float()
        logp = F.log_softmax(logits[0], dim=-1)
        lps.append(logp.gather(-1, torch.tensor(s[1:])[:, None]).squeeze(-1))
    loss = loss_of(lps)
    loss.backward()
    state.accumulated += 1
    trainer.model.eval()
    trainer.optim_step(pid, ADAM)
    return float(loss.detach())


def _max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_new_losses_and_custom_losses_equal_the_in_process_ones(
    tk_gateway, tk_model, tenant_key, tmp_path
) -> None:
    import tinker

    from catalog.store import AdapterStore
    from schemas.events.steps import StepDatum
    from workers.trainer.config import TrainerConfig
    from workers.trainer.engine import MultiPolicyTrainer
    from workers.trainer.policies import LoraShape

    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = MultiPolicyTrainer(TrainerConfig(base_model=str(tk_model)), AdapterStore(tmp_path))
    shape = LoraShape(rank=8, alpha=16.0, target_modules=ATTN)
    plain = [
        StepDatum(tokens=s[:-1], target_tokens=s[1:], weights=[1.0] * (len(s) - 1))
        for s in SEQUENCES
    ]

    def forward(pid: str) -> list[list[float]]:
        return trainer.forward_datums(pid, plain, "cross_entropy", {}, False)[1]

    trainer.add_policy("inproc/start", shape, seed=0)
    start = forward("inproc/start")
    g = torch.Generator().manual_seed(7)
    sampler = [[v + 0.3 * float(torch.randn(1, generator=g)) for v in row] for row in start]
    advantages = [[float(torch.randn(1, generator=g)) for _ in row] for row in start]
    masks = [[0.0] + [1.0] * (len(row) - 1) for row in start]
    q = [torch.tensor(r) for r in sampler]
    a = [torch.tensor(r) for r in advantages]
    m = [torch.tensor(r) for r in masks]
    ref = [torch.tensor(r) for r in start]

    def rl_batch(with_mask: bool) -> list[types.Datum]:
        out = []
        for s, lp, adv, mask in zip(SEQUENCES, sampler, advantages, masks, strict=True):
            inputs = {"target_tokens": s[1:], "logprobs": lp, "advantages": adv}
            if with_mask:
                inputs["sequence_ratio_mask"] = mask
            out.append(
                types.Datum(model_input=types.ModelInput.from_ints(s[:-1]), loss_fn_inputs=inputs)
            )
        return out

    w = [[2.0, -1.5, 0.25, -3.0, 0.5], [-0.75, 1.25, -2.0, 4.0]]

    def dpo(data, lps):  # seq 0 chosen, seq 1 rejected, the start policy as the reference
        margin = (lps[0] - ref[0]).sum() - (lps[1] - ref[1]).sum()
        return -F.logsigmoid(0.5 * margin), {"dpo_margin": float(margin.detach())}

    def linear(data, lps):
        return sum((lp * torch.tensor(wi)).sum() for lp, wi in zip(lps, w, strict=True)), {}

    builtin = {
        "cispo": ({"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, _cispo, False),
        "dro": ({"beta": 0.3}, _dro, False),
        "gspo": ({"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}, _gspo, True),
    }
    _, key = tenant_key()
    service = tinker.ServiceClient(base_url=tk_gateway, api_key=key)
    report = {}
    cases = [*builtin, "custom_dpo", "custom_linear"]
    for name in cases:
        tc = service.create_lora_training_client(
            str(tk_model), rank=8, seed=0, train_mlp=False, train_unembed=False
        ).result(timeout=WAIT_S)
        pid = f"inproc/{name}"
        trainer.add_policy(pid, shape, seed=0)
        if name in builtin:
            config, formula, with_mask = builtin[name]
            fb = tc.forward_backward(rl_batch(with_mask), name, config)

            def loss_of(lps, config=config, formula=formula, with_mask=with_mask):
                extra = (lambda i: (m[i],)) if with_mask else (lambda i: ())
                return sum(formula(lps[i], q[i], a[i], config, *extra(i)) for i in range(len(lps)))
        else:
            fn = dpo if name == "custom_dpo" else linear
            fb = tc.forward_backward_custom([datum(s) for s in SEQUENCES], fn)

            def loss_of(lps, fn=fn):
                return fn(None, lps)[0]

        opt = tc.optim_step(
            types.AdamParams(**{k: ADAM[k] for k in ("learning_rate", "beta1", "beta2", "eps")})
        )
        sdk_loss = fb.result(timeout=WAIT_S).metrics["loss:sum"]
        opt.result(timeout=WAIT_S)
        sdk_after = [
            o["logprobs"].tolist()
            for o in tc.forward([datum(s) for s in SEQUENCES], "cross_entropy")
            .result(timeout=WAIT_S)
            .loss_fn_outputs
        ]
        inproc_loss = _inproc_step(trainer, pid, loss_of)
        inproc_after = forward(pid)
        # the same step with the gradient 1.5 times as large: how far a wrong gradient lands
        trainer.add_policy(f"{pid}/x1.5", shape, seed=0)
        _inproc_step(trainer, f"{pid}/x1.5", lambda lps, f=loss_of: 1.5 * f(lps))
        report[name] = {
            "loss_sdk": sdk_loss,
            "loss_inproc": inproc_loss,
            "after_step_max_abs_diff": _max_diff(sdk_after, inproc_after),
            "step_moved_logprobs_by": _max_diff(inproc_after, start),
            "a_1.5x_gradient_differs_by": _max_diff(forward(f"{pid}/x1.5"), inproc_after),
        }
    print("loss comparison (SDK vs in-process):")
    for name, r in report.items():
        print(f"  {name}: {r}")
    for name, r in report.items():
        assert abs(r["loss_sdk"] - r["loss_inproc"]) <= TOL * max(1.0, abs(r["loss_inproc"])), r
        assert r["a_1.5x_gradient_differs_by"] > 50 * TOL, (name, r)  # not a vacuous check
        assert r["after_step_max_abs_diff"] <= TOL, (name, r)
    service.close("success").result(timeout=60)
