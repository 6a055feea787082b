"""``torch.compile(model, backend="pjrt")``: Dynamo graphs as whole XLA programs.

AOT autograd splits each Dynamo graph into a forward and a backward graph of ATen
ops (or one inference graph); each is lowered through the same registry as eager
ops into one jitted JAX function (:class:`~torch_pjrt.compile.program.GraphProgram`).
Nodes without a lowering are partitioned out and run eagerly, and counted.

Importing this package is cheap; Dynamo is imported when the backend first runs.
"""

from __future__ import annotations

from torch_pjrt.compile.compiler import backend, dump_graphs

__all__ = ["backend", "dump_graphs"]
