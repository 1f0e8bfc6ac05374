"""quickdraft: a code-completion backend for IDE assistants with latency SLOs.

Subpackages (each a top-level folder of the repository):

- ``quickdraft.server``     gRPC server, engine wrapper, admission, metrics, controller
- ``quickdraft.client``     sync and asyncio Python clients
- ``quickdraft.lsp_bridge`` the language server editors start (``quickdraft lsp``)
- ``quickdraft.bench``      load generator and benchmarks (``quickdraft bench``)
- ``quickdraft.v1``         generated protobuf/gRPC stubs (from ``proto/``)
"""

__version__ = "0.1.0"
