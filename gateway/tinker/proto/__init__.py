"""The Tinker SDK's protobuf messages, vendored: ``tinker_public.proto`` (recovered from the SDK's
descriptor by ``recover.py``, package renamed to ``mint.tinker_public``) and the
``tinker_public_pb2`` module protoc generated from it. See README.md here to regenerate them."""
