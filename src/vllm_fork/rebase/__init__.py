"""`vllm-fork rebase` and `vllm-fork matrix`; the rebase state machine is engine.py."""
