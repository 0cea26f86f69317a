"""The benchmark suite of `tensorsmith bench`: each module defines CASES, a list of tensorsmith.bench.Case."""
