"""`vllm-fork backport`: one fork commit carried to every base that has its code
(:mod:`.carry` the all-or-none engine, :mod:`.checks` the fork tests it runs per base)."""
