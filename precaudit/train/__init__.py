"""precaudit train: the backward pass and the optimizer step of a PyTorch model in a float16 or bfloat16
training regime, audited statically and on one step run twice (float32 and the regime, op by op).

Importing this package imports no torch; train.audit is where the work is. The facts of its sites are named with
every other kind's, in analysis/sites/base.py: the rule loader reads them there.
"""
