"""tensorsmith: a search-based tensor compiler.

>>> import tensorsmith as ts
>>> g = ts.Graph("double"); x = g.input("x", (8,), "float32"); g.output("y", x * 2)
>>> ts.evaluate(g, {"x": np.ones(8, np.float32)})["y"]
"""
from tensorsmith.ir import (DType, DTypeError, Graph, GraphError, InputError, ShapeError, TargetError, Tensor,
                            TensorsmithError, constant, evaluate, iota, nn)

__version__ = "0.1.0"

__all__ = ["DType", "DTypeError", "Graph", "GraphError", "InputError", "ShapeError", "TargetError", "Tensor",
           "TensorsmithError", "constant", "evaluate", "iota", "nn", "__version__"]
