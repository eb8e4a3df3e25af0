"""The ops tests' shared setup (the suite-wide one is ``tests/conftest.py``)."""

import warnings

with warnings.catch_warnings():
    # Inductor's first compile in a process imports torch.utils.mkldnn, which warns at
    # import (torch.jit.script_method is deprecated): torch's own import, which
    # tests/deprecation_guard.py would pin on the bass call that compiled first (flex).
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch.utils.mkldnn  # noqa: F401
