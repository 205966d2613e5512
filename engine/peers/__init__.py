"""Peer systems (transformers, bitsandbytes, llama.cpp, and our engine the same way), each measured in a fresh process."""
