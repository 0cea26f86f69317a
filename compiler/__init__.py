"""tensorsmith: a search-based tensor compiler.

>>> import tensorsmith as ts
>>> g = ts.Graph("double"); x = g.input("x", (8,), "float32"); g.output("y", x * 2)
>>> prog = ts.compile(g, target="sm90")
"""
from tensorsmith.ir import (CompileError, DeviceError, DType, DTypeError, Graph, GraphError, InputError, OutputError,
                            ShapeError, TargetError, Tensor, TensorsmithError, constant, evaluate, iota, nn)

from .pipeline import VERSION as __version__
from .pipeline import compile
from .program import Program, load
from .imported import ModelImportError
from .onnx_import import OnnxImportError, from_onnx, import_onnx
from .torch_import import TorchImportError, from_torch, import_torch

__all__ = ["CompileError", "DeviceError", "DType", "DTypeError", "Graph", "GraphError", "InputError", "OutputError",
           "ShapeError", "TargetError", "Tensor", "TensorsmithError", "constant", "evaluate", "iota", "nn", "compile",
           "Program", "load", "from_torch", "import_torch", "TorchImportError", "from_onnx", "import_onnx",
           "OnnxImportError", "ModelImportError", "__version__"]
