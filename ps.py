"""``jobman.ps``: Multiverso's parameter-server API over MPI; see ``jobman.dispatch.ps``."""

from jobman.dispatch.ps import (
    ArrayTableHandler,
    MatrixTableHandler,
    PSError,
    barrier,
    init,
    is_master_worker,
    num_workers,
    shutdown,
    worker_id,
)

__all__ = [
    "init",
    "barrier",
    "shutdown",
    "num_workers",
    "worker_id",
    "is_master_worker",
    "ArrayTableHandler",
    "MatrixTableHandler",
    "PSError",
]
