"""tensorsmith.ir: the graph, its primitive ops, the nn library, the reference interpreter, KernelProgram."""
from . import nn
from .dtypes import DType
from .errors import (CompileError, DeviceError, DTypeError, GraphError, InputError, OutputError, ShapeError,
                     TargetError, TensorsmithError)
from .graph import Graph
from .interpreter import evaluate
from .node import Node
from .ops import Op
from .tensor import Tensor, constant, iota

__all__ = ["nn", "DType", "Graph", "Node", "Op", "Tensor", "constant", "iota", "evaluate", "TensorsmithError",
           "ShapeError", "DTypeError", "GraphError", "InputError", "TargetError", "CompileError", "DeviceError",
           "OutputError"]
