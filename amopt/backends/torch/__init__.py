"""Kernels of :func:`amopt.minimize`'s loop on torch CUDA tensors: the AM rule
(:mod:`.rule`) and the momentum apply (:mod:`.apply`) as Triton kernels."""
