"""CuPy's generated kernels: the AM rule (:mod:`.rule`), the momentum apply
(:mod:`.apply`) and the logistic loss of the problems (:mod:`.logistic`)."""
