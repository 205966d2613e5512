"""The inference core: our model and its KV cache, sampling, generation, speculative proposers and
verification, the model catalog and loader. Imports only engine.common, engine.quant and engine.ops."""
