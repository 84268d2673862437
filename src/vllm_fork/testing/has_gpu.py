"""Exit 0 when torch in this interpreter sees a CUDA or HIP GPU, else 1.

Run by path with a work tree's test interpreter (which does not have the
tool installed) to decide whether ``Fork-Proof: gpu`` patches can be judged.
"""

import sys

try:
    import torch
except ImportError:
    sys.exit(1)
sys.exit(0 if torch.cuda.is_available() else 1)
