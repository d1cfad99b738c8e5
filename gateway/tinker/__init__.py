"""The Tinker HTTP API (``/api/v1``) on the gateway, for the official ``tinker`` SDK 0.38.0:
training calls become ``train.step.requested`` commands (schemas.events.steps) answered on
``train.step.results``; sampling runs on the engines as token prompts.

router (HTTP) → service (the calls: tenancy, models, sampling) → steps (the mapping onto the
step contract) / sampling (onto ``infer.requested``) / wire (the SDK's protobuf) / futures (the
polling protocol) / trainer (Kafka in and out).
"""
