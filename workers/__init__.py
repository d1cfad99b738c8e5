"""Long-running consumer-group workers: trainer, rollout/serving, evaluator, controller, projector."""
