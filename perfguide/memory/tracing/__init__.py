"""Helpers of the exact memory mode (``perfguide.memory.trace``).

They run the real Hugging Face modules on fake CPU tensors, so no GPU, no weights and almost no host RAM are
needed; what a CUDA run does differently (autocast op lists, the SDPA kernel choice, the allocator's 512-byte
rounding) is modelled here rather than obtained by patching a CPU-only torch build into pretending it has CUDA.
Every module imports torch lazily or is only imported from inside ``trace_memory``.
"""
