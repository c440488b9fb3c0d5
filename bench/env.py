"""What every measuring module gets: iteration counts, a scratch directory, a unique label."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BenchEnv:
    """Shared settings of one ``python3 -m bench`` run."""

    scratch: Path
    """A temporary directory removed after the run (workspaces live here)."""
    warm_iterations: int = 300
    """Samples of each ~1 ms figure."""
    docker_iterations: int = 40
    """Samples of each ~50 ms Docker API figure."""
    cold_iterations: int = 8
    """Samples of each ~300 ms figure (container creation)."""
    concurrency_sessions: int = 100
    """Sessions of the concurrency figure (each makes a container and runs 4 calls at once)."""
    density_sessions: int = 24
    """Idle sessions of the density figure (each with its container started)."""
    pool_sessions: int = 40
    """Sessions of the warm pool figure (created at 10 per second)."""
    restart_large_sessions: int = 1000
    """Sessions of the large restart row (each with its container when memory allows)."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def instance(self) -> str:
        """Instance label of every container this run creates (all removed at the end)."""
        return f"bench-{self.run_id}"

    def workspace(self, name: str) -> Path:
        path = self.scratch / name
        path.mkdir(parents=True, exist_ok=True)
        return path
