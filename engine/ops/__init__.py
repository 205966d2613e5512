"""Kernels: building and loading kernels/ (C++ and CUDA), the formats they read, dispatch, and the PyTorch reference path."""
