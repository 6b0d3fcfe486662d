"""precaudit: a precision audit for ML models in fp16, bf16 and fp8."""

__version__ = "0.1.0"
