"""Op families, one folder each: ``naive.py`` is the pure-PyTorch reference (the CPU path and the test
oracle), ``kernel.py`` the Triton kernel. The public contract (schemas, validation, fake implementations)
lives in :mod:`fastnf4._ops`."""
