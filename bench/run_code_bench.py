"""run_code (issue 34 part 1) on a Docker session of the default image, beside ``shell python3 -c``
doing the same: a ``1+1`` cell in a live context, a context started afresh (``restart``), and a
matplotlib figure that comes back as a PNG of about 100 KB. The shell rows pay a python3 start
(and for the figure, numpy and matplotlib's import) on every call; a context pays them once."""

from __future__ import annotations

import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.env import BenchEnv
from bench.sandbox_bench import _context, _session
from bench.table import Row, row
from dispatcher.core.blocks import ImageBlock
from dispatcher.core.types import ToolContext
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.tools import RunCodeTool, ShellTool

GROUP = "run_code"
FIGURE = (
    "import numpy as np\nimport matplotlib.pyplot as plt\nrng = np.random.default_rng(0)\n"
    "plt.figure(figsize=(6, 4.5), dpi=100)\nplt.scatter(rng.random(1300), rng.random(1300), s=3, c=rng.random(1300))\n"
)
SHELL_FIGURE = (
    FIGURE + "import io\nb = io.BytesIO()\nplt.savefig(b, format='png')\nprint(len(b.getvalue()))\n"
)


async def _timed(runs: int, work: Callable[[], Awaitable[None]]) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _run(context: ToolContext, code: str, **input: Any) -> list[int]:
    output = await RunCodeTool().execute({"code": code, **input}, context)
    if not output.success:
        raise RuntimeError(f"run_code failed: {output.content[0]}")
    return [len(b.data) for b in output.content if isinstance(b, ImageBlock)]


async def _shell(context: ToolContext, code: str) -> str:
    output = await ShellTool(persist=False).execute({"command": f"python3 -c {shlex.quote(code)}"}, context)
    block = output.content[0]
    return block.text if not isinstance(block, ImageBlock) else ""


async def measure(env: BenchEnv) -> list[Row]:
    """p50s of run_code cells and of the same through shell, on one Docker session."""
    provider = DockerSandboxProvider(SandboxConfig(), instance=env.instance)
    rows: list[Row] = []
    runs = max(5, env.cold_iterations)
    try:
        session = _session(env, "runcode")
        sandbox = provider.sandbox_for(session)
        context = _context(sandbox, session.workspace_path)
        await _shell(context, "pass")  # the container is up before anything is timed
        await _run(context, "1+1")  # and the context

        async def cell() -> None:
            await _run(context, "1+1")

        async def fresh() -> None:
            await _run(context, "1+1", restart=True)

        async def shell_sum() -> None:
            await _shell(context, "print(1+1)")

        sizes: list[int] = []

        async def figure() -> None:
            sizes[:] = await _run(context, FIGURE)

        shell_sizes: list[str] = []

        async def shell_figure() -> None:
            shell_sizes[:] = [(await _shell(context, SHELL_FIGURE)).strip()]

        rows.append(row(GROUP, "run_code 1+1, live context", await _timed(runs * 4, cell)))
        rows.append(row(GROUP, "run_code 1+1, context started afresh (restart)", await _timed(runs, fresh)))
        rows.append(row(GROUP, "shell python3 -c 'print(1+1)'", await _timed(runs * 4, shell_sum)))
        await _run(context, FIGURE)  # numpy and matplotlib imported once, as a context keeps them
        samples = await _timed(runs, figure)
        rows.append(
            row(GROUP, "run_code figure -> PNG block", samples, f"{sizes[0]:,} bytes" if sizes else "")
        )
        samples = await _timed(runs, shell_figure)
        note = f"{int(shell_sizes[0]):,} bytes" if shell_sizes and shell_sizes[0].isdigit() else ""
        rows.append(row(GROUP, "shell python3 -c, the same figure to PNG bytes", samples, note))
        await provider.close_session(session.session_id)
    finally:
        await provider.aclose()
    return rows
